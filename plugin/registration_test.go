package plugin

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
)

// recordHandler is a slog.Handler that keeps every record, with the
// attributes of the logger it came through, and signals each new one.
type recordHandler struct {
	st    *recordStore
	attrs []slog.Attr
}

type recordStore struct {
	mu      sync.Mutex
	recs    []logRecord
	changed chan struct{}
}

// logRecord is one captured log line, attributes flattened by key.
type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newRecordHandler() *recordHandler {
	return &recordHandler{st: &recordStore{changed: make(chan struct{}, 1)}}
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.st.mu.Lock()
	h.st.recs = append(h.st.recs, rec)
	h.st.mu.Unlock()
	select {
	case h.st.changed <- struct{}{}:
	default:
	}
	return nil
}

func (h *recordHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &recordHandler{st: h.st, attrs: append(slices.Clone(h.attrs), attrs...)}
}

// WithGroup is not used by the package; groups are flattened.
func (h *recordHandler) WithGroup(string) slog.Handler { return h }

func (h *recordHandler) records() []logRecord {
	h.st.mu.Lock()
	defer h.st.mu.Unlock()
	return slices.Clone(h.st.recs)
}

// waitFor blocks until cond holds for the records logged so far.
func (h *recordHandler) waitFor(t *testing.T, what string, cond func([]logRecord) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for !cond(h.records()) {
		select {
		case <-h.st.changed:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// count returns how many records match level (or any level if nil) and msg.
func count(recs []logRecord, level *slog.Level, msg string, attrs map[string]string) int {
	n := 0
	for _, r := range recs {
		if level != nil && r.level != *level || msg != "" && r.msg != msg {
			continue
		}
		match := true
		for k, v := range attrs {
			match = match && r.attrs[k] == v
		}
		if match {
			n++
		}
	}
	return n
}

const (
	noKubeletMsg   = "no kubelet is listening on its registration socket; will keep trying quietly (log level debug shows each attempt) and log when registration succeeds"
	attemptMsg     = "registration with kubelet failed, retrying"
	registeredMsg  = "registered with kubelet"
	retryWarnedMsg = "registration with kubelet failed, retrying with backoff"
)

// TestNoKubeletLoggedOnce runs a manager with no kubelet through several
// failed registration attempts per resource, then starts one: the absence
// is one info line for all resources naming kubelet.sock, every attempt is
// at debug level, nothing is a warning, and each resource logs its
// registration once the kubelet is there.
func TestNoKubeletLoggedOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources []string
		// stale leaves a kubelet.sock nobody listens on, as a kubelet that
		// died does: connects are refused rather than finding no file.
		stale    bool
		attempts int
	}{
		{name: "no socket, one resource", resources: []string{"nvidia.com/gpu"}, attempts: 4},
		{name: "no socket, five resources", resources: []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb", "rdma/ib"}, attempts: 5},
		{name: "stale socket refuses, two resources", resources: []string{"nvidia.com/gpu", "rdma/ib"}, stale: true, attempts: 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t)
			kubeletSock := filepath.Join(dir, "kubelet.sock")
			if tc.stale {
				l, err := net.ListenUnix("unix", &net.UnixAddr{Name: kubeletSock, Net: "unix"})
				if err != nil {
					t.Fatal(err)
				}
				l.SetUnlinkOnClose(false)
				l.Close()
			}
			h := newRecordHandler()
			m, err := NewManager(Options{Dir: dir, Logger: slog.New(h)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- m.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			var res []Resource
			for _, name := range tc.resources {
				res = append(res, &fakeResource{name: name, devs: gpus(1)})
			}
			m.Sync(res)

			debug := slog.LevelDebug
			h.waitFor(t, "failed attempts of every resource", func(recs []logRecord) bool {
				for _, name := range tc.resources {
					if count(recs, &debug, attemptMsg, map[string]string{"resource": name}) < tc.attempts-1 {
						return false
					}
				}
				return true
			})
			info := slog.LevelInfo
			recs := h.records()
			if n := count(recs, &info, noKubeletMsg, map[string]string{"kubeletSocket": kubeletSock}); n != 1 {
				t.Errorf("%d no-kubelet lines naming %s, want 1", n, kubeletSock)
			}
			if n := count(recs, nil, noKubeletMsg, nil); n != 1 {
				t.Errorf("%d no-kubelet lines in all, want 1", n)
			}
			for _, r := range recs {
				if r.level >= slog.LevelWarn {
					t.Errorf("%s line while no kubelet listens: %s %v", r.level, r.msg, r.attrs)
				}
			}

			if tc.stale {
				if err := os.Remove(kubeletSock); err != nil {
					t.Fatal(err)
				}
			}
			startFakeKubelet(t, dir, false)
			// A server whose retry timer and the kubelet.sock event both
			// fire registers twice, which is harmless: at least one line
			// per resource.
			h.waitFor(t, "a registered line per resource", func(recs []logRecord) bool {
				for _, name := range tc.resources {
					if count(recs, &info, registeredMsg, map[string]string{"resource": name}) == 0 {
						return false
					}
				}
				return true
			})
			recs = h.records()
			if n := count(recs, nil, noKubeletMsg, nil); n != 1 {
				t.Errorf("%d no-kubelet lines after registering, want 1", n)
			}
			if n := count(recs, nil, retryWarnedMsg, nil); n != 0 {
				t.Errorf("%d retry warnings, want none: an absent kubelet is not a failing one", n)
			}
		})
	}
}

// TestRegisterTellsAbsentKubeletFromFailingOne checks the error one
// registration attempt returns: errNoKubelet only when nothing listens.
func TestRegisterTellsAbsentKubeletFromFailingOne(t *testing.T) {
	for _, tc := range []struct {
		name          string
		setup         func(t *testing.T, dir string)
		wantNoKubelet bool
	}{
		{name: "no socket file", setup: func(*testing.T, string) {}, wantNoKubelet: true},
		{name: "stale socket refuses", wantNoKubelet: true, setup: func(t *testing.T, dir string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "kubelet.sock"), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}},
		{name: "kubelet refuses the registration", wantNoKubelet: false, setup: func(t *testing.T, dir string) {
			k := startFakeKubelet(t, dir, false)
			k.mu.Lock()
			k.failNext = 1
			k.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortTempDir(t)
			tc.setup(t, dir)
			m, err := newMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			const name = "nvidia.com/gpu"
			var gen atomic.Uint64
			s := newServer(name, filepath.Join(dir, socketName(name, "")), &fakeResource{name: name, devs: gpus(1)}, testLogger(t), m, &gen, gracePeriod)
			if err := s.serve(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.stop() })
			err = s.register(context.Background(), filepath.Join(dir, "kubelet.sock"))
			if err == nil {
				t.Fatal("registration succeeded")
			}
			if got := errors.Is(err, errNoKubelet); got != tc.wantNoKubelet {
				t.Errorf("errors.Is(%v, errNoKubelet) = %v, want %v", err, got, tc.wantNoKubelet)
			}
		})
	}
}

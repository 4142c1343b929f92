package plugin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeKubelet is the kubelet's registration side: a Registration server on
// <dir>/kubelet.sock that records every RegisterRequest and, like the real
// kubelet, dials the plugin's socket back and reads its options before it
// answers.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer

	dir  string
	grpc *grpc.Server

	mu        sync.Mutex
	reqs      []*pluginapi.RegisterRequest
	failNext  int     // Register calls still to refuse
	errs      []error // dial-back problems, which fail the test
	cleanSock bool    // remove every socket in dir at start, as the kubelet does
	regCh     chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) socket() string { return filepath.Join(k.dir, "kubelet.sock") }

// startFakeKubelet listens on <dir>/kubelet.sock. With clean, it first removes
// every other socket in dir, as the kubelet's CleanupPluginDirectory does.
func startFakeKubelet(t testing.TB, dir string, clean bool) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, regCh: make(chan *pluginapi.RegisterRequest, 1024), cleanSock: clean}
	if clean {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Type()&os.ModeSocket != 0 {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}
	}
	lis, err := net.Listen("unix", k.socket())
	if err != nil {
		t.Fatalf("fake kubelet: %v", err)
	}
	k.grpc = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.grpc, k)
	go k.grpc.Serve(lis)
	t.Cleanup(k.stop)
	return k
}

// stop is a kubelet going away: the server stops and kubelet.sock is gone.
func (k *fakeKubelet) stop() {
	k.grpc.Stop()
	os.Remove(k.socket())
}

func (k *fakeKubelet) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	if k.failNext > 0 {
		k.failNext--
		k.mu.Unlock()
		return nil, fmt.Errorf("fake kubelet refuses %s", req.ResourceName)
	}
	k.mu.Unlock()
	if err := k.dialBack(ctx, req); err != nil {
		k.mu.Lock()
		k.errs = append(k.errs, err)
		k.mu.Unlock()
		return nil, err
	}
	k.mu.Lock()
	k.reqs = append(k.reqs, req)
	k.mu.Unlock()
	k.regCh <- req
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) dialBack(ctx context.Context, req *pluginapi.RegisterRequest) error {
	c := dialPlugin(filepath.Join(k.dir, req.Endpoint))
	defer c.Close()
	opts, err := pluginapi.NewDevicePluginClient(c).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("dial back %s: %w", req.Endpoint, err)
	}
	if !sameOptions(opts, req.Options) {
		return fmt.Errorf("%s: registered options %v, server says %v", req.ResourceName, req.Options, opts)
	}
	return nil
}

// waitRegistrations returns the next n RegisterRequests.
func (k *fakeKubelet) waitRegistrations(t testing.TB, n int) []*pluginapi.RegisterRequest {
	t.Helper()
	var out []*pluginapi.RegisterRequest
	timeout := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case r := <-k.regCh:
			out = append(out, r)
		case <-timeout:
			t.Fatalf("got %d of %d registrations; dial-back errors: %v", len(out), n, k.dialErrors())
		}
	}
	return out
}

func (k *fakeKubelet) dialErrors() []error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]error(nil), k.errs...)
}

// dialPlugin connects to a plugin socket; the connection is lazy, so a
// missing socket shows as an error on the first call.
func dialPlugin(path string) *grpc.ClientConn {
	c, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err) // only for a malformed target, which would be a test bug
	}
	return c
}

// testLogger writes to t.Log until the test's cleanup, and drops anything
// logged later, so a late goroutine cannot panic the test binary.
func testLogger(t testing.TB) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(p[:len(p)-1]))
	}
	return len(p), nil
}

func (w *tWriter) close() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
}

// testEnv is a Manager running against a fake kubelet in a short temp dir.
type testEnv struct {
	dir     string
	kubelet *fakeKubelet
	m       *Manager
	cancel  context.CancelFunc
	done    chan error
}

func newTestEnv(t testing.TB, opts Options) *testEnv {
	t.Helper()
	e := &testEnv{dir: testutil.ShortTempDir(t), done: make(chan error, 1)}
	e.kubelet = startFakeKubelet(t, e.dir, false)
	opts.Dir = e.dir
	if opts.Logger == nil {
		if _, bench := t.(*testing.B); bench {
			opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		} else {
			opts.Logger = testLogger(t)
		}
	}
	m, err := NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	go func() { e.done <- m.Run(ctx) }()
	t.Cleanup(e.stop)
	return e
}

// stop cancels Run and waits for it; safe to call twice.
func (e *testEnv) stop() {
	e.cancel()
	if e.done != nil {
		<-e.done
		e.done = nil
	}
}

// client dials the socket of resource.
func (e *testEnv) client(t testing.TB, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	c := dialPlugin(filepath.Join(e.dir, socketName(resource, "")))
	t.Cleanup(func() { c.Close() })
	return pluginapi.NewDevicePluginClient(c)
}

// eventually polls cond until it holds; the timeout only bounds a failing
// test, it is not a latency assertion.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

package plugin

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestSocketName(t *testing.T) {
	for _, tc := range []struct{ resource, instance, want string }{
		{"nvidia.com/gpu", "", "gpu-node-agent-nvidia.com-gpu.sock"},
		{"nvidia.com/mig-1g.10gb", "", "gpu-node-agent-nvidia.com-mig-1g.10gb.sock"},
		{"rdma/hca_shared", "", "gpu-node-agent-rdma-hca_shared.sock"},
		{"../../etc/x", "", "gpu-node-agent-..-..-etc-x.sock"},
		{"nvidia.com/gpu", "0f3a9c1e", "gpu-node-agent-nvidia.com-gpu-0f3a9c1e.sock"},
	} {
		t.Run(tc.resource+"/"+tc.instance, func(t *testing.T) {
			if got := socketName(tc.resource, tc.instance); got != tc.want {
				t.Errorf("socketName(%q, %q) = %q, want %q", tc.resource, tc.instance, got, tc.want)
			}
		})
	}
}

func TestInstance(t *testing.T) {
	for uid, want := range map[string]string{
		"":                                     "",
		"0F3A9C1E-77d2-4b8e-9a3e-5c1d2b3a4f60": "0f3a9c1e",
		"ab-cd":                                "abcd",
	} {
		if got := InstanceFromPodUID(uid); got != want {
			t.Errorf("InstanceFromPodUID(%q) = %q, want %q", uid, got, want)
		}
		if err := checkInstance(InstanceFromPodUID(uid)); err != nil {
			t.Errorf("checkInstance(InstanceFromPodUID(%q)): %v", uid, err)
		}
	}
	for _, bad := range []string{"A1", "a/b", "a-b", "0123456789abcdefg"} {
		if _, err := NewManager(Options{Dir: t.TempDir(), Instance: bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("NewManager with instance %q: err %v, want one naming it", bad, err)
		}
	}
}

func TestNewManagerOptions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		opts        Options
		wantDir     string
		wantKubelet string
		wantErr     bool
	}{
		{name: "defaults", wantDir: "/var/lib/kubelet/device-plugins", wantKubelet: "/var/lib/kubelet/device-plugins/kubelet.sock"},
		{name: "dir only", opts: Options{Dir: "/tmp/dp"}, wantDir: "/tmp/dp", wantKubelet: "/tmp/dp/kubelet.sock"},
		{name: "socket name", opts: Options{Dir: "/tmp/dp/", KubeletSocket: "k.sock"}, wantDir: "/tmp/dp", wantKubelet: "/tmp/dp/k.sock"},
		{name: "absolute socket in dir", opts: Options{Dir: "/tmp/dp", KubeletSocket: "/tmp/dp/kubelet.sock"}, wantDir: "/tmp/dp", wantKubelet: "/tmp/dp/kubelet.sock"},
		{name: "socket outside dir", opts: Options{Dir: "/tmp/dp", KubeletSocket: "/run/kubelet.sock"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewManager(tc.opts)
			if tc.wantErr {
				if err == nil {
					t.Fatal("NewManager succeeded, want error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.dir != tc.wantDir || m.kubeletSocket != tc.wantKubelet {
				t.Errorf("dir, kubelet socket = %s, %s; want %s, %s", m.dir, m.kubeletSocket, tc.wantDir, tc.wantKubelet)
			}
		})
	}
}

func TestRegistration(t *testing.T) {
	base := func(name string) *fakeResource { return &fakeResource{name: name, devs: gpus(2)} }
	resources := []Resource{
		base("nvidia.com/gpu"),
		&preferredResource{fakeResource: base("nvidia.com/mig-1g.10gb"), prefer: firstN},
		&preStartResource{fakeResource: base("rdma/hca")},
		&bothResource{
			preferredResource: &preferredResource{fakeResource: base("example.com/both"), prefer: firstN},
			preStartResource:  &preStartResource{fakeResource: base("example.com/both")},
		},
	}
	want := map[string]*pluginapi.DevicePluginOptions{
		"nvidia.com/gpu":         {},
		"nvidia.com/mig-1g.10gb": {GetPreferredAllocationAvailable: true},
		"rdma/hca":               {PreStartRequired: true},
		"example.com/both":       {GetPreferredAllocationAvailable: true, PreStartRequired: true},
	}
	e := newTestEnv(t, Options{})
	e.m.Sync(resources)
	got := map[string]*pluginapi.RegisterRequest{}
	for _, r := range e.kubelet.waitRegistrations(t, len(resources)) {
		if _, dup := got[r.ResourceName]; dup {
			t.Errorf("%s registered twice", r.ResourceName)
		}
		got[r.ResourceName] = r
	}
	for name, opts := range want {
		t.Run(name, func(t *testing.T) {
			r, ok := got[name]
			if !ok {
				t.Fatalf("%s not registered", name)
			}
			if r.Version != pluginapi.Version {
				t.Errorf("version = %q, want %q", r.Version, pluginapi.Version)
			}
			if r.Endpoint != socketName(name, "") {
				t.Errorf("endpoint = %q, want %q", r.Endpoint, socketName(name, ""))
			}
			if !sameOptions(r.Options, opts) {
				t.Errorf("options = %v, want %v", r.Options, opts)
			}
			if _, err := os.Stat(filepath.Join(e.dir, r.Endpoint)); err != nil {
				t.Errorf("socket: %v", err)
			}
		})
	}
	eventually(t, "Registered() all true", func() bool {
		reg := e.m.Registered()
		return len(reg) == len(want) && !slices.Contains(slices.Collect(maps.Values(reg)), false)
	})
}

func TestRegistrationRetry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fails int
	}{
		{"first attempt succeeds", 0},
		{"one refusal, logged at debug only", 1},
		{"three refusals", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			e := newTestEnv(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			e.kubelet.mu.Lock()
			e.kubelet.failNext = tc.fails
			e.kubelet.mu.Unlock()
			e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: gpus(1)}})
			e.kubelet.waitRegistrations(t, 1)
			eventually(t, "registered", func() bool { return e.m.Registered()["nvidia.com/gpu"] })
			out := logs.String()
			wantWarn := 0
			if tc.fails > 1 {
				wantWarn = 1 // a failure streak is logged once, not per attempt
			}
			if n := strings.Count(out, "registration with kubelet failed"); n != wantWarn {
				t.Errorf("%d failure lines, want %d:\n%s", n, wantWarn, out)
			}
			if !strings.Contains(out, "failedAttempts="+strconv.Itoa(tc.fails)) {
				t.Errorf("success line does not count %d failed attempts:\n%s", tc.fails, out)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer safe for the manager's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestOptionsChangeReregisters(t *testing.T) {
	e := newTestEnv(t, Options{})
	plain := &fakeResource{name: "nvidia.com/gpu", devs: gpus(2)}
	e.m.Sync([]Resource{plain})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; r.Options.GetPreferredAllocationAvailable {
		t.Fatal("plain resource advertised preferred allocation")
	}
	// The solver became available: the kubelet must learn it.
	e.m.Sync([]Resource{&preferredResource{fakeResource: plain, prefer: firstN}})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; !r.Options.GetPreferredAllocationAvailable {
		t.Fatal("re-registration did not advertise preferred allocation")
	}
}

// recvList receives one list from a ListAndWatch stream as "ID:health:numa".
func recvList(t *testing.T, s pluginapi.DevicePlugin_ListAndWatchClient) []string {
	t.Helper()
	resp, err := s.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch Recv: %v", err)
	}
	return describe(resp.Devices)
}

func describe(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		numa := "-"
		if d.Topology != nil {
			var ns []string
			for _, n := range d.Topology.Nodes {
				ns = append(ns, string(rune('0'+n.ID)))
			}
			numa = strings.Join(ns, ",")
		}
		out = append(out, d.ID+":"+d.Health+":"+numa)
	}
	return out
}

func TestListAndWatch(t *testing.T) {
	const name = "nvidia.com/gpu"
	initial := []Device{
		{ID: "b", Healthy: true, NUMANodes: []int64{1}},
		{ID: "a", Healthy: true, NUMANodes: []int64{0}},
	}
	steps := []struct {
		name string
		devs []Device
		want []string // nil: no push expected
	}{
		{"same list, other order", []Device{initial[1], initial[0]}, nil},
		{"health change", []Device{{ID: "a", Healthy: false, NUMANodes: []int64{0}}, initial[0]},
			[]string{"a:Unhealthy:0", "b:Healthy:1"}},
		{"unchanged again", []Device{{ID: "a", Healthy: false, NUMANodes: []int64{0}}, initial[0]}, nil},
		{"device added without NUMA", []Device{{ID: "a", Healthy: false, NUMANodes: []int64{0}}, initial[0], {ID: "c", Healthy: true}},
			[]string{"a:Unhealthy:0", "b:Healthy:1", "c:Healthy:-"}},
		{"NUMA change", []Device{{ID: "a", Healthy: false, NUMANodes: []int64{0, 1}}, initial[0], {ID: "c", Healthy: true}},
			[]string{"a:Unhealthy:0,1", "b:Healthy:1", "c:Healthy:-"}},
		{"device removed", []Device{initial[0]}, []string{"b:Healthy:1"}},
		{"empty", nil, nil}, // checked below: an empty list is a change too
	}
	steps[len(steps)-1].want = []string{}

	e := newTestEnv(t, Options{})
	e.m.Sync([]Resource{&fakeResource{name: name, devs: initial}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := e.client(t, name)
	var streams []pluginapi.DevicePlugin_ListAndWatchClient
	for range 2 {
		s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := recvList(t, s), []string{"a:Healthy:0", "b:Healthy:1"}; !slices.Equal(got, want) {
			t.Fatalf("initial list = %v, want %v", got, want)
		}
		streams = append(streams, s)
	}
	eventually(t, "two streams open", func() bool { return e.m.servers[name].watcherCount() == 2 })

	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			e.m.Sync([]Resource{&fakeResource{name: name, devs: st.devs}})
			if st.want == nil {
				return // verified by the next step: its list must come first
			}
			for i, s := range streams {
				got := recvList(t, s)
				if got == nil {
					got = []string{}
				}
				if !slices.Equal(got, st.want) {
					t.Errorf("stream %d got %v, want %v", i, got, st.want)
				}
			}
		})
	}
}

func TestResourceRemoval(t *testing.T) {
	e := newTestEnv(t, Options{})
	gpu := &fakeResource{name: "nvidia.com/gpu", devs: gpus(2)}
	mig := &fakeResource{name: "nvidia.com/mig-1g.10gb", devs: gpus(3)}
	e.m.Sync([]Resource{gpu, mig})
	e.kubelet.waitRegistrations(t, 2)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := map[string]pluginapi.DevicePlugin_ListAndWatchClient{}
	for _, name := range []string{gpu.name, mig.name} {
		s, err := e.client(t, name).ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		recvList(t, s)
		streams[name] = s
	}

	e.m.Sync([]Resource{gpu}) // the MIG profile is gone
	if _, err := streams[mig.name].Recv(); err != io.EOF {
		t.Errorf("removed resource's stream: Recv error %v, want io.EOF", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, socketName(mig.name, ""))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed resource's socket still there: %v", err)
	}
	if _, ok := e.m.Registered()[mig.name]; ok {
		t.Error("removed resource still in Registered()")
	}
	// The other resource is untouched: its stream still gets updates.
	e.m.Sync([]Resource{&fakeResource{name: gpu.name, devs: gpus(1)}})
	if got := recvList(t, streams[gpu.name]); len(got) != 1 {
		t.Errorf("remaining resource's update = %v, want 1 device", got)
	}
	// And the removed one can come back.
	e.m.Sync([]Resource{gpu, mig})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; r.ResourceName != mig.name {
		t.Errorf("re-added resource registered as %q", r.ResourceName)
	}
}

func TestKubeletRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		clean bool // the new kubelet removes our sockets, as the real one does
	}{
		{"kubelet removes plugin sockets", true},
		{"plugin sockets left in place", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, Options{})
			var names []string
			var res []Resource
			for _, n := range []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "rdma/hca"} {
				names = append(names, n)
				res = append(res, &fakeResource{name: n, devs: gpus(2)})
			}
			e.m.Sync(res)
			e.kubelet.waitRegistrations(t, len(res))
			sort.Strings(names)
			allRegistered := func() bool {
				reg := e.m.Registered()
				return len(reg) == len(res) && !slices.Contains(slices.Collect(maps.Values(reg)), false)
			}

			var took []time.Duration
			for i := range 5 {
				eventually(t, "Registered() all true", allRegistered)
				e.kubelet.stop()
				eventually(t, "Registered() all false", func() bool {
					for _, ok := range e.m.Registered() {
						if ok {
							return false
						}
					}
					return true
				})
				start := time.Now()
				e.kubelet = startFakeKubelet(t, e.dir, tc.clean)
				var got []string
				for _, r := range e.kubelet.waitRegistrations(t, len(res)) {
					got = append(got, r.ResourceName)
				}
				took = append(took, time.Since(start))
				sort.Strings(got)
				if !slices.Equal(got, names) {
					t.Fatalf("restart %d: re-registered %v, want %v", i, got, names)
				}
				// The re-created sockets serve.
				for _, n := range names {
					if _, err := e.client(t, n).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); err != nil {
						t.Errorf("restart %d: %s after re-registration: %v", i, n, err)
					}
				}
			}
			t.Logf("re-registration of %d resources after kubelet.sock re-created: %v", len(res), took)
		})
	}
}

func TestShutdown(t *testing.T) {
	e := newTestEnv(t, Options{})
	names := []string{"nvidia.com/gpu", "rdma/hca"}
	e.m.Sync([]Resource{&fakeResource{name: names[0], devs: gpus(1)}, &fakeResource{name: names[1], devs: gpus(1)}})
	e.kubelet.waitRegistrations(t, 2)
	s, err := e.client(t, names[0]).ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recvList(t, s)

	e.stop()
	if _, err := s.Recv(); err != io.EOF && status.Code(err) != codes.Unavailable {
		t.Errorf("stream after shutdown: %v, want io.EOF or Unavailable", err)
	}
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), socketPrefix) {
			t.Errorf("socket %s left after shutdown", ent.Name())
		}
	}
	if _, err := os.Stat(e.kubelet.socket()); err != nil {
		t.Errorf("shutdown touched kubelet.sock: %v", err)
	}
	e.m.Sync([]Resource{&fakeResource{name: "late", devs: gpus(1)}})
	if len(e.m.Registered()) != 0 {
		t.Error("Sync after shutdown started a server")
	}
}

func TestStartFailureIsolated(t *testing.T) {
	e := newTestEnv(t, Options{})
	// A regular file where a socket should go must not be removed, and must
	// not stop the other resources.
	blocked := "example.com/blocked"
	if err := os.WriteFile(filepath.Join(e.dir, socketName(blocked, "")), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A stale socket from a previous run is replaced.
	stale := "example.com/stale"
	startFakeKubeletAt(t, filepath.Join(e.dir, socketName(stale, "")))

	e.m.Sync([]Resource{&fakeResource{name: blocked, devs: gpus(1)}, &fakeResource{name: stale, devs: gpus(1)}})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; r.ResourceName != stale {
		t.Errorf("registered %q, want %q", r.ResourceName, stale)
	}
	if _, ok := e.m.Registered()[blocked]; ok {
		t.Errorf("%s served over a regular file", blocked)
	}
	if b, err := os.ReadFile(filepath.Join(e.dir, socketName(blocked, ""))); err != nil || string(b) != "x" {
		t.Errorf("regular file at socket path changed: %q, %v", b, err)
	}
}

// startFakeKubeletAt leaves a stale socket at path: listened on, then the
// listener closed without unlinking, as after a crash.
func startFakeKubeletAt(t *testing.T, path string) {
	t.Helper()
	l, _, err := listenUnix(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

// TestSyncBeforeRun covers an agent whose first Sync comes before Run and
// before the device-plugin directory exists: Run starts the server then.
func TestSyncBeforeRun(t *testing.T) {
	dir := filepath.Join(testutil.ShortTempDir(t), "dp")
	m, err := NewManager(Options{Dir: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: gpus(1)}})
	if len(m.Registered()) != 0 {
		t.Fatal("server started without its directory")
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	k := startFakeKubelet(t, dir, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	if r := k.waitRegistrations(t, 1)[0]; r.ResourceName != "nvidia.com/gpu" {
		t.Errorf("registered %q", r.ResourceName)
	}
	if err := m.Run(ctx); err == nil {
		t.Error("second Run succeeded")
	}
}

// TestSlowStreamDoesNotBlockSync has a stream that reads nothing while many
// lists are synced: Sync must not wait for it, and when it reads it gets
// the latest list (intermediate ones may be skipped).
func TestSlowStreamDoesNotBlockSync(t *testing.T) {
	const name = "nvidia.com/gpu"
	e := newTestEnv(t, Options{})
	e.m.Sync([]Resource{&fakeResource{name: name, devs: gpus(8)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.client(t, name).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "stream open", func() bool { return e.m.servers[name].watcherCount() == 1 })
	const syncs = 500
	var last []Device
	for i := range syncs {
		last = gpus(8)
		last[i%8].Healthy = false
		e.m.Sync([]Resource{&fakeResource{name: name, devs: last}})
	}
	want := describe(newDeviceList(last).devs)
	received := 0
	for {
		got := recvList(t, s)
		received++
		if slices.Equal(got, want) {
			break
		}
		if received > syncs+1 {
			t.Fatalf("never received the last list %v", want)
		}
	}
	t.Logf("stream received %d lists for %d syncs", received, syncs)
}

// TestConcurrentSync runs Syncs of changing resource sets from several
// goroutines while a stream reads (for -race), then checks a final Sync wins.
func TestConcurrentSync(t *testing.T) {
	e := newTestEnv(t, Options{})
	names := []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "rdma/hca"}
	e.m.Sync([]Resource{&fakeResource{name: names[0], devs: gpus(4)}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := e.client(t, names[0]).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				set := []Resource{&fakeResource{name: names[0], devs: gpus(1 + (g+i)%4)}}
				for j, n := range names[1:] {
					if (g+i+j)%2 == 0 {
						set = append(set, &fakeResource{name: n, devs: gpus(2)})
					}
				}
				e.m.Sync(set)
				e.m.Registered()
			}
		})
	}
	wg.Wait()
	e.m.Sync([]Resource{&fakeResource{name: names[0], devs: gpus(3)}, &fakeResource{name: names[3], devs: gpus(1)}})
	got := slices.Sorted(maps.Keys(e.m.Registered()))
	if want := []string{names[0], names[3]}; !slices.Equal(got, want) {
		t.Errorf("served %v after final Sync, want %v", got, want)
	}
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	var socks []string
	for _, ent := range ents {
		if strings.HasPrefix(ent.Name(), socketPrefix) {
			socks = append(socks, ent.Name())
		}
	}
	if want := []string{socketName(names[0], ""), socketName(names[3], "")}; !slices.Equal(socks, want) {
		t.Errorf("sockets %v, want %v", socks, want)
	}
}

// blockingResource's Allocate waits for release, to hold a call in flight.
type blockingResource struct {
	*fakeResource
	entered chan struct{}
	release chan struct{}
}

func (r *blockingResource) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	close(r.entered)
	<-r.release
	return r.fakeResource.Allocate(ctx, ids)
}

// TestStoppingServerDoesNotBlockManager removes a resource while one of its
// Allocate calls is in flight, so its server waits for the call. Meanwhile
// Registered, another Sync and kubelet-restart handling must go ahead; the
// removed server's socket must stay gone; and the call still completes.
func TestStoppingServerDoesNotBlockManager(t *testing.T) {
	e := newTestEnv(t, Options{})
	e.m.mu.Lock()
	e.m.grace = time.Hour // only the release below ends the wait
	e.m.mu.Unlock()
	gpu := &fakeResource{name: "nvidia.com/gpu", devs: gpus(1)}
	slow := &blockingResource{fakeResource: &fakeResource{name: "example.com/slow", devs: gpus(1)}, entered: make(chan struct{}), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(slow.release)
		}
	}
	defer release()
	e.m.Sync([]Resource{gpu, slow})
	e.m.mu.Lock()
	slowServer := e.m.servers[slow.name]
	e.m.mu.Unlock()

	allocErr := make(chan error, 1)
	go func() {
		_, err := e.client(t, slow.name).Allocate(context.Background(), &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-0"}}},
		})
		allocErr <- err
	}()
	<-slow.entered

	syncDone := make(chan struct{})
	go func() {
		e.m.Sync([]Resource{gpu})
		close(syncDone)
	}()
	eventually(t, "removed server stopping", func() bool {
		slowServer.mu.Lock()
		defer slowServer.mu.Unlock()
		return slowServer.stopped
	})

	others := make(chan map[string]bool, 1)
	go func() {
		e.m.kubeletStarted()
		e.m.Sync([]Resource{gpu, &fakeResource{name: "rdma/hca", devs: gpus(1)}})
		others <- e.m.Registered()
	}()
	select {
	case got := <-others:
		if want := []string{"nvidia.com/gpu", "rdma/hca"}; !slices.Equal(slices.Sorted(maps.Keys(got)), want) {
			t.Errorf("served %v while a removed server stopped, want %v", slices.Sorted(maps.Keys(got)), want)
		}
	case <-time.After(10 * time.Second): // bounds a failing test only
		t.Fatal("Registered, Sync or kubelet-restart handling blocked by a stopping server")
	}
	select {
	case <-syncDone:
		t.Fatal("Sync returned before the call in flight ended")
	default:
	}
	if _, err := os.Stat(filepath.Join(e.dir, socketName(slow.name, ""))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removed resource's socket exists while it stops: %v", err)
	}

	release()
	<-syncDone
	if err := <-allocErr; err != nil {
		t.Errorf("Allocate in flight during removal: %v", err)
	}
}

// TestStoppedServerErrorsNameResource checks that the errors of a stopped
// server say which resource they are about.
func TestStoppedServerErrorsNameResource(t *testing.T) {
	const name = "nvidia.com/mig-1g.10gb"
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	var gen atomic.Uint64
	s := newServer(name, filepath.Join(testutil.ShortTempDir(t), socketName(name, "")), &fakeResource{name: name, devs: gpus(1)}, testLogger(t), m, &gen, gracePeriod)
	if err := s.serve(); err != nil {
		t.Fatal(err)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		err  error
	}{
		{"serve", s.serve()},
		{"addWatcher", func() error { _, _, err := s.addWatcher(); return err }()},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), name) {
			t.Errorf("%s after stop: error %v does not name %s", tc.what, tc.err, name)
		}
	}
}

package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fakeKubelet accepts every device-plugin registration on dir/kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
}

func (fakeKubelet) Register(context.Context, *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	return &pluginapi.Empty{}, nil
}

func startFakeKubelet(t *testing.T, dir string) {
	t.Helper()
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(s, fakeKubelet{})
	go s.Serve(ln)
	t.Cleanup(s.Stop)
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitResetRequested waits until the monitor has read the driver's request
// to reset GPU id (the recovery-action cause): a reset it never saw asked
// for leaves it no evidence to release a held fault.
func waitResetRequested(t *testing.T, mon interface{ Status(string) health.Status }, id string) {
	t.Helper()
	testutil.WaitFor(t, "the driver's reset request for "+id, func() bool {
		return strings.Contains(strings.Join(mon.Status(id).Reasons, " "), "driver requests a gpu reset")
	})
}

// recvUntil reads ListAndWatch updates until device id has health want.
func recvUntil(t *testing.T, stream pluginapi.DevicePlugin_ListAndWatchClient, id, want string) {
	t.Helper()
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("waiting for %s to be %s: %v", id, want, err)
		}
		for _, d := range resp.Devices {
			if d.ID == id && d.Health == want {
				return
			}
		}
	}
}

// TestAgentWiring runs the whole agent in-process on a simulated DGX H100
// with a fake kubelet: faults injected through the simulator's control
// endpoint reach ListAndWatch and go again after recovery, the rdma/ib
// resource is served, and /metrics and /readyz answer.
func TestAgentWiring(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	startFakeKubelet(t, dir)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.GPU.MIGStrategy = gpu.MIGStrategyNone
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = freeport.Addr(t)
	cfg.SimControlAddress = freeport.Addr(t)
	cfg.RescanInterval = 0
	cfg.Health.RecoveryPeriod = time.Second
	cfg.Health.PollInterval = 200 * time.Millisecond
	cfg.Health.DCGMMode = "off"
	cfg.MetricsInterval = 200 * time.Millisecond
	cfg.RDMA.Resources = []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}}
	var logs syncBuffer
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(&logs, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// Registered before startAgent's cleanup, so it runs after the agent
	// has stopped and its log is complete.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	})
	ctx, _ := startAgent(t, a)
	stream, first := watchFirst(t, ctx, dir, "nvidia.com/gpu")
	if len(first.Devices) != 8 {
		t.Fatalf("nvidia.com/gpu: %d devices, want 8", len(first.Devices))
	}
	node := a.rec.current().node
	if node == nil {
		t.Fatal("no node after the first ListAndWatch answer")
	}

	t.Run("preferred allocation from the topology solver", func(t *testing.T) {
		client := dialPlugin(t, socketFor(dir, "nvidia.com/gpu"))
		opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
		if err != nil || !opts.GetPreferredAllocationAvailable {
			t.Fatalf("options %v, %v: preferred allocation not advertised", opts, err)
		}
		var all []string
		for _, g := range node.GPUs {
			all = append(all, g.UUID)
		}
		resp, err := client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: all, AllocationSize: 2}}})
		if err != nil {
			t.Fatal(err)
		}
		want, err := topology.NewAllocator(node).Preferred(all, nil, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.ContainerResponses[0].DeviceIDs; !slices.Equal(got, want) {
			t.Errorf("preferred %v, want the solver's %v", got, want)
		}
	})

	t.Run("reset-class xid: unhealthy until the gpu is reset, then healthy after the recovery period", func(t *testing.T) {
		id := node.GPUs[3].UUID
		testutil.WaitFor(t, "the health monitor listening for XIDs", a.mon.Listening)
		testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"xid","gpu":3,"xid":79}`)
		recvUntil(t, stream, id, pluginapi.Unhealthy)
		if fit, _ := a.mon.NodeFit(); fit {
			t.Error("node fit with GPU 3 unhealthy")
		}
		if st := a.mon.Status(id); !strings.Contains(strings.Join(st.Reasons, " "), "held until reset") {
			t.Errorf("GPU 3 reasons %v, want the xid held until reset", st.Reasons)
		}
		waitResetRequested(t, a.mon, id)
		testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"gpu-reset","gpu":3}`)
		recvUntil(t, stream, id, pluginapi.Healthy)
	})
	t.Run("lasting fault: unhealthy until cleared and recovered", func(t *testing.T) {
		id := node.GPUs[5].UUID
		testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, `{"kind":"gpu-lost","gpu":5}`)
		recvUntil(t, stream, id, pluginapi.Unhealthy)
		// The XID 79 that comes with it is held until a reset; the GPU
		// answering again after a sample saw it lost is that evidence
		// (a GPU that is back before any sample saw it gone leaves none,
		// and stays held until an operator clears it).
		testutil.WaitFor(t, "a sample to see GPU 5 lost", func() bool {
			return strings.Contains(strings.Join(a.mon.Status(id).Reasons, " "), "gpu lost")
		})
		testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, `{"kind":"gpu-lost","gpu":5}`)
		recvUntil(t, stream, id, pluginapi.Healthy)
	})

	t.Run("rdma/ib served", func(t *testing.T) {
		rs, err := dialPlugin(t, socketFor(dir, "rdma/ib")).ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		list, err := rs.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Devices) != len(node.NICs) || len(list.Devices) == 0 {
			t.Fatalf("rdma/ib: %d devices, want one per NIC (%d)", len(list.Devices), len(node.NICs))
		}
		for _, d := range list.Devices {
			if d.Health != pluginapi.Healthy || d.ID == "" {
				t.Errorf("rdma/ib device %q is %s", d.ID, d.Health)
			}
		}
	})

	t.Run("metrics and readiness", func(t *testing.T) {
		base := "http://" + cfg.MetricsAddress
		testutil.WaitFor(t, "DCGM metrics", func() bool {
			_, body := httpGet(base + "/metrics")
			return strings.Contains(body, "DCGM_FI_DEV_GPU_UTIL{")
		})
		_, body := httpGet(base + "/metrics")
		for _, want := range []string{"gpu_node_agent_build_info{", "gpu_node_agent_device_healthy", "gpu_node_agent_collection_duration_seconds", "go_goroutines ", "process_resident_memory_bytes "} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		// The XID injected above, through the monitor's event set.
		xid := regexp.MustCompile(`DCGM_FI_DEV_XID_ERRORS\{[^}]*UUID="` + node.GPUs[3].UUID + `"[^}]*\} 79\n`)
		testutil.WaitFor(t, "GPU 3's XID in DCGM_FI_DEV_XID_ERRORS", func() bool { _, body := httpGet(base + "/metrics"); return xid.MatchString(body) })
		testutil.WaitFor(t, "/readyz ok", func() bool { code, _ := httpGet(base + "/readyz"); return code == http.StatusOK })
		if code, _ := httpGet(base + "/healthz"); code != http.StatusOK {
			t.Errorf("/healthz: %d", code)
		}
	})
}

// TestReadyzBeforeRegistration: without a kubelet nothing is registered,
// so the agent is alive but not ready, and says which resource is missing.
func TestReadyzBeforeRegistration(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := defaults()
	cfg.Simulate = "pcie-8gpu"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = freeport.Addr(t)
	cfg.SimControlAddress = ""
	a, err := openAgent(cfg, slog.New(slog.DiscardHandler), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, a)
	base := "http://" + cfg.MetricsAddress
	testutil.WaitFor(t, "/healthz", func() bool { code, _ := httpGet(base + "/healthz"); return code == http.StatusOK })
	testutil.WaitFor(t, "a discovered node", func() bool { return a.rec.current().node != nil })
	code, body := httpGet(base + "/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "nvidia.com/gpu is not registered") {
		t.Errorf("/readyz = %d %q, want 503 naming nvidia.com/gpu", code, body)
	}
}

// syncBuffer is a bytes.Buffer safe for the agent's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

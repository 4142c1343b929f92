package agent

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi/kubeapitest"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// flapRDMAConfig serves the simulated InfiniBand ports as rdma/ib with the
// port state polled every 50ms and the counters every 50ms: three link
// downs within 10s make a port flapping, 6s without one clear it.
func flapRDMAConfig() rdma.Config {
	return rdma.Config{
		PollInterval: rdma.Duration(50 * time.Millisecond),
		Resources:    []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}},
		PortCounters: rdma.PortCountersConfig{
			Interval:       rdma.Duration(50 * time.Millisecond),
			RateWindow:     rdma.Duration(time.Second),
			FlapWindow:     rdma.Duration(10 * time.Second),
			FlapThreshold:  3,
			RecoveryPeriod: rdma.Duration(6 * time.Second),
		},
	}
}

// nicFlap is the nic-flap fault on mlx5_3, one down and up every 300ms.
const nicFlap = `{"kind":"nic-flap","nic":"mlx5_3","period":"300ms"}`

// hasCause says whether the health monitor gives id the cause code.
func hasCause(a *Agent, id, code string) bool {
	return slices.Contains(a.mon.Status(id).Causes, code)
}

// TestAgentFlappingPortUnhealthyInListAndWatch: a port whose link keeps
// going down (the simulator's nic-flap) is Unhealthy on rdma/ib's
// ListAndWatch through the port counter check, stays so once the link is
// up again and steady (port ACTIVE, only the flap cause left), and is
// Healthy after the counter check's recovery period.
func TestAgentFlappingPortUnhealthyInListAndWatch(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	cfg := faultBenchConfig(dir)
	cfg.RDMA = flapRDMAConfig()
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ctx, _ := startAgent(t, a)
	stream, first := watchFirst(t, ctx, dir, "rdma/ib")
	if len(first.Devices) != 8 {
		t.Fatalf("rdma/ib serves %d ports, want 8", len(first.Devices))
	}
	// The last health ListAndWatch sent for each port.
	var mu sync.Mutex
	seen := map[string]string{}
	record := func(r *pluginapi.ListAndWatchResponse) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range r.Devices {
			seen[d.ID] = d.Health
		}
	}
	record(first)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return // the agent stopped at the end of the test
			}
			record(r)
		}
	}()
	health := func(id string) string {
		mu.Lock()
		defer mu.Unlock()
		return seen[id]
	}
	ctl := simOf(a).ControlHandler()
	send := func(method, body string) {
		rec := httptest.NewRecorder()
		ctl.ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
		if rec.Code/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, body, rec.Code, rec.Body)
		}
	}

	start := time.Now()
	send(http.MethodPost, nicFlap)
	testutil.WaitFor(t, "mlx5_3 flapping and Unhealthy on ListAndWatch", func() bool {
		return hasCause(a, "mlx5_3", "rdma-counters-flap") && health("mlx5_3") == pluginapi.Unhealthy
	})
	toUnhealthy := time.Since(start)
	send(http.MethodDelete, nicFlap)
	cleared := time.Now()
	// The link is up and steady: the port state cause has cleared (it
	// waits out the recovery with the rest) and only the flap keeps the
	// port out.
	testutil.WaitFor(t, "mlx5_3 up but still out for flapping", func() bool {
		st := a.mon.Status("mlx5_3")
		active := slices.DeleteFunc(slices.Clone(st.Reasons), func(r string) bool { return strings.HasSuffix(r, "(cleared, recovering)") })
		return len(active) == 1 && strings.HasPrefix(active[0], "link flapping: ") && health("mlx5_3") == pluginapi.Unhealthy
	})
	testutil.WaitFor(t, "mlx5_3 Healthy on ListAndWatch after the quiet period", func() bool {
		return health("mlx5_3") == pluginapi.Healthy && a.mon.Status("mlx5_3").Healthy
	})
	toRecovered := time.Since(cleared)
	mu.Lock()
	for id, h := range seen {
		if id != "mlx5_3" && h != pluginapi.Healthy {
			t.Errorf("%s is %s; only mlx5_3 flapped", id, h)
		}
	}
	mu.Unlock()
	t.Logf("nic-flap (300ms period, 3 downs in 10s) to Unhealthy on ListAndWatch: %s; flap cleared to Healthy (6s counter quiet period + 20ms health recovery): %s",
		toUnhealthy.Round(time.Millisecond), toRecovered.Round(time.Millisecond))
}

// TestAgentFlappingPortTaintedInDRA: with NICs served through DRA, the
// flapping NIC's device carries the unhealthy taint for the flap, and
// loses it after the quiet period.
func TestAgentFlappingPortTaintedInDRA(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node-1", UID: "node-uid"}})
	kubeapitest.GenerateNames(client)
	cfg := draTestConfig(t, dir, client, "nic")
	cfg.RDMA = flapRDMAConfig()
	cfg.Health.RecoveryPeriod = 20 * time.Millisecond
	cfg.Health.MaxRecoveryPeriod = 20 * time.Millisecond
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	startAgent(t, a)
	name := dra.NICName("mlx5_3")
	taints := func() []resourceapi.DeviceTaint { return publishedDevices(t, client)[name].Taints }
	testutil.WaitFor(t, "8 NICs in the ResourceSlices", func() bool { return len(publishedDevices(t, client)) == 8 })

	start := time.Now()
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodPost, nicFlap)
	testutil.WaitFor(t, name+" tainted for flapping", func() bool {
		return hasCause(a, "mlx5_3", "rdma-counters-flap") &&
			slices.ContainsFunc(taints(), func(tn resourceapi.DeviceTaint) bool { return tn.Key == dra.TaintKey })
	})
	toTainted := time.Since(start)
	testutil.SimFault(t, cfg.SimControlAddress, http.MethodDelete, nicFlap)
	cleared := time.Now()
	testutil.WaitFor(t, name+" untainted after the quiet period", func() bool { return len(taints()) == 0 })
	toUntainted := time.Since(cleared)
	for n, d := range publishedDevices(t, client) {
		if n != name && len(d.Taints) != 0 {
			t.Errorf("%s tainted too: %v", n, d.Taints)
		}
	}
	t.Logf("DRA: nic-flap to tainted %s; flap cleared to untainted %s", toTainted.Round(time.Millisecond), toUntainted.Round(time.Millisecond))
}

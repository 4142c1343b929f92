package agent

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// BenchmarkMIGChangeToListAndWatch measures the whole path of a device
// change in the running agent: a MIG layout change on the simulated node,
// its Changed signal, rediscovery through NVML, rebuilding the resources,
// Sync, and the push that reaches an open ListAndWatch stream. Each
// iteration turns MIG on GPU 0 on or off, which moves the GPU in or out of
// nvidia.com/gpu. Reports p50 and p99 in ms besides ns/op.
func BenchmarkMIGChangeToListAndWatch(b *testing.B) {
	dir := testutil.ShortTempDir(b)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.GPU.MIGStrategy = gpu.MIGStrategyMixed
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval = 0
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	ctx, _ := startAgent(b, a)
	stream, _ := watchFirst(b, ctx, dir, "nvidia.com/gpu")
	layouts := [][]string{{"7g.80gb"}, nil}
	want := []int{7, 8}
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if err := simOf(a).SetMIGLayout(0, layouts[i%2]); err != nil {
			b.Fatal(err)
		}
		for {
			resp, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Devices) == want[i%2] {
				break
			}
		}
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

// BenchmarkFaultToListAndWatch measures a device fault's path through the
// running agent: an XID 74 (NVLink class: it recovers by itself, where a
// reset-class XID would hold until a reset) injected into the simulated node (its NVML
// event set), the health monitor's observation, its change signal, the
// reconciler's re-sync and the push that reaches an open ListAndWatch
// stream with the GPU Unhealthy. Each iteration faults the next GPU and
// waits (untimed) for it to recover. Reports p50 and p99 in ms.
func BenchmarkFaultToListAndWatch(b *testing.B) {
	dir := testutil.ShortTempDir(b)
	a, err := openAgent(faultBenchConfig(dir), slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	ctx, _ := startAgent(b, a)
	stream, _ := watchFirst(b, ctx, dir, "nvidia.com/gpu")
	node := a.rec.current().node
	ctl := simOf(a).ControlHandler()
	until := func(id, health string) { recvUntilHealth(b, stream, id, health) }
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		g := i % len(node.GPUs)
		req := httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":74}`, g)))
		rec := httptest.NewRecorder()
		start := time.Now()
		ctl.ServeHTTP(rec, req)
		if rec.Code/100 != 2 {
			b.Fatalf("inject: %d %s", rec.Code, rec.Body)
		}
		until(node.GPUs[g].UUID, pluginapi.Unhealthy)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		until(node.GPUs[g].UUID, pluginapi.Healthy)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

// BenchmarkPortDownToListAndWatch measures an RDMA port's failure through
// the running agent: port-down injected on the simulator's control endpoint
// (ports DOWN/Polling and netdev down in the simulated sysfs), the rdma
// watcher's poll seeing it, the health monitor's observation and the push
// that reaches an open rdma/ib ListAndWatch stream with that port
// Unhealthy. The simulator has no netlink, so the poll interval bounds it:
// one sub-benchmark per interval (1s is the default). Each iteration takes
// the next NIC down at a random point of the poll cycle (a fault does not
// wait for the next poll) and waits (untimed) for it to recover. Reports
// p50 and p99 in ms.
func BenchmarkPortDownToListAndWatch(b *testing.B) {
	for _, poll := range []time.Duration{rdma.DefaultPollInterval, 100 * time.Millisecond} {
		b.Run("poll="+poll.String(), func(b *testing.B) {
			dir := testutil.ShortTempDir(b)
			cfg := faultBenchConfig(dir)
			cfg.RDMA = rdma.Config{
				PollInterval: rdma.Duration(poll),
				Resources:    []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}},
			}
			a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			ctx, _ := startAgent(b, a)
			stream, first := watchFirst(b, ctx, dir, "rdma/ib")
			if len(first.Devices) != 8 {
				b.Fatalf("rdma/ib serves %d ports, want 8", len(first.Devices))
			}
			ctl := simOf(a).ControlHandler()
			send := func(method, nic string) {
				req := httptest.NewRequest(method, "/faults", strings.NewReader(fmt.Sprintf(`{"kind":"port-down","nic":%q}`, nic)))
				rec := httptest.NewRecorder()
				ctl.ServeHTTP(rec, req)
				if rec.Code/100 != 2 {
					b.Fatalf("%s port-down %s: %d %s", method, nic, rec.Code, rec.Body)
				}
			}
			until := func(id, health string) { recvUntilHealth(b, stream, id, health) }
			var samples []time.Duration
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				nic := first.Devices[i%len(first.Devices)].ID
				b.StopTimer()
				time.Sleep(rand.N(poll))
				b.StartTimer()
				start := time.Now()
				send(http.MethodPost, nic)
				until(nic, pluginapi.Unhealthy)
				samples = append(samples, time.Since(start))
				b.StopTimer()
				send(http.MethodDelete, nic)
				until(nic, pluginapi.Healthy)
				b.StartTimer()
			}
			b.StopTimer()
			reportPercentiles(b, samples)
		})
	}
}

// faultBenchConfig is the fault benchmarks' agent: a simulated DGX H100
// serving into dir, without metrics, control endpoint, rescans or DCGM,
// whose devices recover 20 ms after their fault clears.
func faultBenchConfig(dir string) testConfig {
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval = 0
	cfg.Health.RecoveryPeriod = 20 * time.Millisecond
	cfg.Health.MaxRecoveryPeriod = 20 * time.Millisecond
	cfg.Health.DCGMMode = "off"
	return cfg
}

// recvUntilHealth reads the ListAndWatch stream until device id is
// reported with the given health.
func recvUntilHealth(b *testing.B, stream pluginapi.DevicePlugin_ListAndWatchClient, id, health string) {
	for {
		resp, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		for _, d := range resp.Devices {
			if d.ID == id && d.Health == health {
				return
			}
		}
	}
}

// reportPercentiles reports the samples' p50 and p99 in ms.
func reportPercentiles(b *testing.B, samples []time.Duration) {
	slices.Sort(samples)
	if n := len(samples); n > 0 {
		b.ReportMetric(float64(samples[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(samples[(n*99)/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkXIDWhileGPUHangs measures, on the running agent, a GPU whose
// NVML calls hang (the simulator's hang fault, as a GSP timeout does):
// first how long until the hung GPU is Unhealthy on ListAndWatch (reported
// as hung-ms: the wait for the next sampling cycle plus the call timeout),
// then, while it stays hung, an XID 74 on each other GPU in turn to that
// GPU Unhealthy on the same stream (p50/p99): the hung GPU must delay no
// other GPU's health. Each iteration waits (untimed) for the recovery.
func BenchmarkXIDWhileGPUHangs(b *testing.B) {
	dir := testutil.ShortTempDir(b)
	cfg := faultBenchConfig(dir)
	cfg.Health.PollInterval = time.Second
	cfg.MetricsInterval = time.Second
	cfg.NVMLCallTimeout = time.Second
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	ctx, _ := startAgent(b, a)
	stream, _ := watchFirst(b, ctx, dir, "nvidia.com/gpu")
	node := a.rec.current().node
	ctl := simOf(a).ControlHandler()
	send := func(method, body string) {
		rec := httptest.NewRecorder()
		ctl.ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
		if rec.Code/100 != 2 {
			b.Fatalf("%s %s: %d %s", method, body, rec.Code, rec.Body)
		}
	}
	hung := len(node.GPUs) - 1
	start := time.Now()
	send(http.MethodPost, fmt.Sprintf(`{"kind":"hang","gpu":%d}`, hung))
	b.Cleanup(func() { send(http.MethodDelete, fmt.Sprintf(`{"kind":"hang","gpu":%d}`, hung)) })
	recvUntilHealth(b, stream, node.GPUs[hung].UUID, pluginapi.Unhealthy)
	hungAfter := time.Since(start)
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		g := i % hung
		start := time.Now()
		send(http.MethodPost, fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":74}`, g))
		recvUntilHealth(b, stream, node.GPUs[g].UUID, pluginapi.Unhealthy)
		samples = append(samples, time.Since(start))
		b.StopTimer()
		recvUntilHealth(b, stream, node.GPUs[g].UUID, pluginapi.Healthy)
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, samples)
	b.ReportMetric(float64(hungAfter.Microseconds())/1000, "hung-ms")
}

package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
)

// BenchmarkMIGChangeToListAndWatch measures the whole path of a device
// change in the running agent: a MIG layout change on the simulated node,
// its Changed signal, rediscovery through NVML, rebuilding the resources,
// Sync, and the push that reaches an open ListAndWatch stream. Each
// iteration turns MIG on GPU 0 on or off, which moves the GPU in or out of
// nvidia.com/gpu. Reports p50 and p99 in ms besides ns/op.
func BenchmarkMIGChangeToListAndWatch(b *testing.B) {
	dir := shortTempDir(b)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.MIGStrategy = gpu.MIGStrategyMixed
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval.Duration = 0
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
		if err := a.hw.sim.SetMIGLayout(0, layouts[i%2]); err != nil {
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
	slices.Sort(samples)
	if n := len(samples); n > 0 {
		b.ReportMetric(float64(samples[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(samples[(n*99)/100].Microseconds())/1000, "p99-ms")
	}
}

// BenchmarkFaultToListAndWatch measures a device fault's path through the
// running agent: an XID 79 injected into the simulated node (its NVML
// event set), the health monitor's observation, its change signal, the
// reconciler's re-sync and the push that reaches an open ListAndWatch
// stream with the GPU Unhealthy. Each iteration faults the next GPU and
// waits (untimed) for it to recover. Reports p50 and p99 in ms.
func BenchmarkFaultToListAndWatch(b *testing.B) {
	dir := shortTempDir(b)
	cfg := defaults()
	cfg.Simulate = "dgx-h100"
	cfg.DevicePluginDir = dir
	cfg.MetricsAddress = ""
	cfg.SimControlAddress = ""
	cfg.RescanInterval.Duration = 0
	cfg.Health.RecoveryPeriod = 20 * time.Millisecond
	cfg.Health.MaxRecoveryPeriod = 20 * time.Millisecond
	cfg.Health.DCGMMode = "off"
	a, err := openAgent(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	ctx, _ := startAgent(b, a)
	stream, _ := watchFirst(b, ctx, dir, "nvidia.com/gpu")
	node := a.rec.current().node
	ctl := a.hw.sim.ControlHandler()
	until := func(id, health string) {
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
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		g := i % len(node.GPUs)
		req := httptest.NewRequest(http.MethodPost, "/faults", strings.NewReader(fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":79}`, g)))
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
	slices.Sort(samples)
	if n := len(samples); n > 0 {
		b.ReportMetric(float64(samples[n/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(samples[(n*99)/100].Microseconds())/1000, "p99-ms")
	}
}

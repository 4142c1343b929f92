package main

import (
	"context"
	"io"
	"log/slog"
	"slices"
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
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	client := dialPlugin(b, socketFor(dir, "nvidia.com/gpu"))
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		b.Fatal(err)
	}
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

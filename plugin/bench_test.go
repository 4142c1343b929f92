package plugin

import (
	"context"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// reportPercentiles adds p50 and p99 (and max) of samples to b's output.
func reportPercentiles(b *testing.B, samples []time.Duration) {
	b.Helper()
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	at := func(q float64) float64 { return float64(samples[int(q*float64(len(samples)-1))].Nanoseconds()) }
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(float64(samples[len(samples)-1].Nanoseconds()), "max-ns")
}

// BenchmarkAllocate is the kubelet's Allocate over gRPC on a unix socket
// against a resource of 8 devices, with 1 and with all 8 devices asked for.
func BenchmarkAllocate(b *testing.B) {
	for _, bc := range []struct {
		name string
		n    int
	}{{"1of8", 1}, {"8of8", 8}} {
		b.Run(bc.name, func(b *testing.B) {
			e := newTestEnv(b, Options{})
			devs := gpus(8)
			e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: devs}})
			c := e.client(b, "nvidia.com/gpu")
			ctx := context.Background()
			reqs := make([]*pluginapi.AllocateRequest, len(devs))
			for i := range reqs {
				var ids []string
				for j := range bc.n {
					ids = append(ids, devs[(i+j)%len(devs)].ID)
				}
				reqs[i] = &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
			}
			// Warm the connection so the first sample is not a dial.
			if _, err := c.Allocate(ctx, reqs[0]); err != nil {
				b.Fatal(err)
			}
			samples := make([]time.Duration, 0, b.N)
			i := 0
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				if _, err := c.Allocate(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				samples = append(samples, time.Since(start))
				i++
			}
			b.StopTimer()
			reportPercentiles(b, samples)
		})
	}
}

// BenchmarkSyncToListAndWatch is the time from Sync with one device's
// health changed to the new list arriving at an open ListAndWatch stream:
// what a health change costs before the kubelet knows.
func BenchmarkSyncToListAndWatch(b *testing.B) {
	e := newTestEnv(b, Options{})
	const name = "nvidia.com/gpu"
	healthy := &fakeResource{name: name, devs: gpus(8)}
	sick := &fakeResource{name: name, devs: gpus(8)}
	sick.devs[5].Healthy = false
	e.m.Sync([]Resource{healthy})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.client(b, name).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		b.Fatal(err)
	}
	samples := make([]time.Duration, 0, b.N)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		next := sick
		if i%2 == 1 {
			next = healthy
		}
		start := time.Now()
		e.m.Sync([]Resource{next})
		resp, err := stream.Recv()
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, time.Since(start))
		if got, want := resp.Devices[5].Health, map[bool]string{true: pluginapi.Healthy, false: pluginapi.Unhealthy}[next == healthy]; got != want {
			b.Fatalf("iteration %d: GPU-5 %s, want %s", i, got, want)
		}
		i++
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

// BenchmarkKubeletRestart is the time from a new kubelet.sock (after the
// kubelet removed every socket, as it does at start) until all 4 resources
// have re-registered and been dialled back.
func BenchmarkKubeletRestart(b *testing.B) {
	e := newTestEnv(b, Options{})
	var res []Resource
	for _, n := range []string{"nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "rdma/hca"} {
		res = append(res, &fakeResource{name: n, devs: gpus(2)})
	}
	e.m.Sync(res)
	e.kubelet.waitRegistrations(b, len(res))
	samples := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		eventually(b, "all registered", func() bool {
			for _, ok := range e.m.Registered() {
				if !ok {
					return false
				}
			}
			return true
		})
		e.kubelet.stop()
		b.StartTimer()
		start := time.Now()
		e.kubelet = startFakeKubelet(b, e.dir, true)
		e.kubelet.waitRegistrations(b, len(res))
		samples = append(samples, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, samples)
}

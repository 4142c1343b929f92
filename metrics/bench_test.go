package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// cpuTime is the process's user+system CPU time so far. Reported per op
// next to wall-clock latency: on a shared, loaded machine the p99 wall
// time mostly measures the scheduler, the CPU time what a scrape costs.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportLatency adds p50/p99 per-op latency and CPU time per op (since
// cpu0) to the benchmark output.
func reportLatency(b *testing.B, d []time.Duration, cpu0 time.Duration) {
	if len(d) == 0 {
		return
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(len(d)), "cpu-ns/op")
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)*50/100].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[min(len(d)-1, len(d)*99/100)].Nanoseconds()), "p99-ns")
}

// BenchmarkScrape measures one /metrics request against the agent's
// registry (Go and process collectors, build info, the GPU collector) on a
// simulated dgx-h100 with 14 MIG devices: what Prometheus pays per scrape.
func BenchmarkScrape(b *testing.B) {
	reg := NewRegistry("bench")
	c, _ := newSimCollector(b, reg)
	collectNow(b, c)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		start := time.Now()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		lat = append(lat, time.Since(start))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
	}
	reportLatency(b, lat, cpu0)
}

// BenchmarkScrapeGPUOnly isolates the GPU collector: gather and encode
// only the DCGM families.
func BenchmarkScrapeGPUOnly(b *testing.B) {
	reg := prometheus.NewRegistry()
	c, _ := newSimCollector(b, reg)
	collectNow(b, c)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		start := time.Now()
		h.ServeHTTP(discardWriter{}, req)
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat, cpu0)
}

// BenchmarkRefresh measures one render of the latest sampling cycle (8
// GPUs and 14 MIG devices on the simulator) into the cached metrics: what
// the collector adds per cycle on top of the sampler.
func BenchmarkRefresh(b *testing.B) {
	c, _ := newSimCollector(b, prometheus.NewRegistry())
	ctx := context.Background()
	collectNow(b, c)
	lat := make([]time.Duration, 0, 1<<14)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		start := time.Now()
		c.Refresh(ctx)
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat, cpu0)
}

// BenchmarkCycle measures one sampling cycle (every NVML read of 8 GPUs
// and 14 MIG devices through the NVML owner) plus its render: what the
// agent spends per interval, never on a scrape.
func BenchmarkCycle(b *testing.B) {
	c, _ := newSimCollector(b, prometheus.NewRegistry())
	ctx := context.Background()
	lat := make([]time.Duration, 0, 1<<14)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for b.Loop() {
		start := time.Now()
		c.sampler.SampleNow(ctx)
		c.Refresh(ctx)
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat, cpu0)
}

type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return io.Discard.Write(p) }
func (discardWriter) WriteHeader(int)             {}

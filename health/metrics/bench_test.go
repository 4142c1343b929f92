package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// reportLatency adds p50/p99 per-op latency to the benchmark output.
func reportLatency(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
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
	c.CollectNow(context.Background())
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		lat = append(lat, time.Since(start))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
	}
	reportLatency(b, lat)
}

// BenchmarkScrapeGPUOnly isolates the GPU collector: gather and encode
// only the DCGM families.
func BenchmarkScrapeGPUOnly(b *testing.B) {
	reg := prometheus.NewRegistry()
	c, _ := newSimCollector(b, reg)
	c.CollectNow(context.Background())
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		h.ServeHTTP(discardWriter{}, req)
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat)
}

// BenchmarkCollect measures one collection cycle (all NVML reads of 8 GPUs
// and 14 MIG devices plus rendering the snapshot) on the simulator; it
// runs on the collection interval, never on a scrape.
func BenchmarkCollect(b *testing.B) {
	c, _ := newSimCollector(b, prometheus.NewRegistry())
	ctx := context.Background()
	lat := make([]time.Duration, 0, 1<<14)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		c.CollectNow(ctx)
		lat = append(lat, time.Since(start))
	}
	reportLatency(b, lat)
}

type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return io.Discard.Write(p) }
func (discardWriter) WriteHeader(int)             {}

package topology

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkPreferred measures Preferred on every GPU of a fixture and
// reports the p99 latency of the measured calls.
func BenchmarkPreferred(b *testing.B) {
	for _, bc := range []struct {
		fixture string
		sizes   []int
	}{
		{"dgx1-volta", []int{1, 2, 3, 4, 5, 6, 7, 8}},
		{"dgx-h100", []int{2, 4}},
		{"dgx1v-x2", []int{2, 3, 4, 8}},
		{"dgx2", []int{2, 3, 4, 8}},
	} {
		n := loadSolverNode(b, bc.fixture)
		a := NewAllocator(n)
		avail := gpuIDs(n, allIdx(n)...)
		for _, size := range bc.sizes {
			b.Run(fmt.Sprintf("%s/gpus=%d/size=%d", bc.fixture, len(avail), size), func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				b.ReportAllocs()
				for b.Loop() {
					start := time.Now()
					if _, err := a.Preferred(avail, nil, size); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				b.ReportMetric(float64(p99(lat).Nanoseconds()), "p99-ns")
			})
		}
	}
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}

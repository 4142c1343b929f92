package topology

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPreferred measures Preferred on every GPU of a fixture. Besides
// ns/op it reports the p99 wall latency of single calls and, because wall
// time on a shared machine mostly measures the other tenants, the mean and
// p99 CPU time of the benchmark's own thread per call.
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
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var lat, cpu []time.Duration
				b.ReportAllocs()
				for b.Loop() {
					start, cpu0 := time.Now(), threadCPU()
					if _, err := a.Preferred(avail, nil, size); err != nil {
						b.Fatal(err)
					}
					cpu = append(cpu, threadCPU()-cpu0)
					lat = append(lat, time.Since(start))
				}
				reportLatency(b, lat, cpu)
			})
		}
	}
}

// threadCPU is the CPU time consumed by the calling OS thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func reportLatency(b *testing.B, wall, cpu []time.Duration) {
	var sum time.Duration
	for _, d := range cpu {
		sum += d
	}
	if len(cpu) > 0 {
		b.ReportMetric(float64(sum.Nanoseconds())/float64(len(cpu)), "cpu-ns/op")
	}
	b.ReportMetric(float64(p99(wall).Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(p99(cpu).Nanoseconds()), "p99-cpu-ns")
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)*99)/100]
}

package nvmlowner

import (
	"context"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// BenchmarkSampleShared is one sampling cycle of a simulated DGX H100
// (GPU 0 with two 3g.40gb MIG devices) whose GPUs run no process ("idle")
// or four each ("shared": four time-sliced pods per whole GPU, two
// processes on each MIG device), with the NVML calls a cycle makes
// (nvml-calls/op) and those of the per-process reads alone
// (GetProcessUtilization, and GetComputeRunningProcesses on MIG devices).
func BenchmarkSampleShared(b *testing.B) {
	for _, busy := range []bool{false, true} {
		name := map[bool]string{false: "idle", true: "shared"}[busy]
		b.Run(name, func(b *testing.B) {
			node, _, s, targets := simSampler(b, "dgx-h100", sim.WithMIG(0, "3g.40gb", "3g.40gb"))
			if busy {
				for gpu := range targets {
					for k := range 4 {
						spec := sim.ProcessSpec{GPU: gpu, MemoryMiB: 1000, Kind: sim.ProcessPod,
							ProcessUtilization: sim.ProcessUtilization{SMUtil: uint32(10 + k), MemUtil: 3}}
						if len(targets[gpu].MIG) > 0 {
							spec.MIG = targets[gpu].MIG[k%2].UUID
						}
						if _, err := node.StartProcess(spec); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			ctx := context.Background()
			s.SampleNow(ctx)
			before := node.NVMLCalls()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				s.SampleNow(ctx)
			}
			b.StopTimer()
			after := node.NVMLCalls()
			var total, perProcess uint64
			for call, n := range after {
				total += n - before[call]
			}
			perProcess = after["GetProcessUtilization"] - before["GetProcessUtilization"]
			// The MIG devices' own lists: every call beyond one per GPU.
			perProcess += after["GetComputeRunningProcesses"] - before["GetComputeRunningProcesses"] - uint64(len(targets)*b.N)
			b.ReportMetric(float64(total)/float64(b.N), "nvml-calls/op")
			b.ReportMetric(float64(perProcess)/float64(b.N), "per-process-calls/op")
		})
	}
}

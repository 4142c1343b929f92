package nvmlowner_test

import (
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// BenchmarkDiscover measures one full discovery of a simulated node (the
// simulator's own cost included; a real driver is slower per call).
func BenchmarkDiscover(b *testing.B) {
	for _, name := range []string{"dgx-h100", "dgx-2"} {
		b.Run(name, func(b *testing.B) {
			spec, err := sim.Profile(name)
			if err != nil {
				b.Fatal(err)
			}
			n, err := sim.New(spec, b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := nvmlowner.Discover(n.NVML(), n.HostRoot(), nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package sim

import "testing"

// BenchmarkNew measures building a simulated DGX H100 (NVML mock + host tree).
func BenchmarkNew(b *testing.B) {
	spec, err := Profile("dgx-h100", WithMIG(0, "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := New(spec, b.TempDir(), nil); err != nil {
			b.Fatal(err)
		}
	}
}

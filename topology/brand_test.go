package topology

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestBrandNames: every brand nvml.h defines has go-nvlib's name and maps
// back; BRAND_COUNT and values beyond it have none.
func TestBrandNames(t *testing.T) {
	for b, want := range map[nvml.BrandType]string{nvml.BRAND_TESLA: "Tesla", nvml.BRAND_NVIDIA: "Nvidia", nvml.BRAND_QUADRO_RTX: "QuadroRTX", nvml.BRAND_UNKNOWN: "Unknown"} {
		if got := BrandName(b); got != want {
			t.Errorf("BrandName(%d) = %q, want %q", b, got, want)
		}
	}
	for b := nvml.BRAND_UNKNOWN; b < nvml.BRAND_COUNT; b++ {
		name := BrandName(b)
		if name == "" {
			continue
		}
		if back, ok := BrandType(name); !ok || back != b {
			t.Errorf("BrandType(%q) = %d, %v; want %d", name, back, ok, b)
		}
	}
	if BrandName(nvml.BRAND_COUNT) != "" || BrandName(99) != "" {
		t.Error("a brand nvml.h does not define has a name")
	}
	if _, ok := BrandType("Radeon"); ok {
		t.Error(`BrandType("Radeon") found`)
	}
}

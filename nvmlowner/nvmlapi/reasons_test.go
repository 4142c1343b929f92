package nvmlapi_test

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

func TestClocksEventReasons(t *testing.T) {
	var all uint64
	for _, r := range nvmlapi.ClocksEventReasons {
		if all&r.Bit != 0 {
			t.Errorf("%s: bit %#x used twice", r.Name, r.Bit)
		}
		all |= r.Bit
		if b, err := nvmlapi.ClocksEventReasonBit(r.Name); err != nil || b != r.Bit {
			t.Errorf("ClocksEventReasonBit(%q) = %#x, %v", r.Name, b, err)
		}
	}
	if all != nvml.ClocksEventReasonAll {
		t.Errorf("the reasons cover %#x, nvml.h's nvmlClocksEventReasonAll is %#x", all, uint64(nvml.ClocksEventReasonAll))
	}
	if _, err := nvmlapi.ClocksEventReasonBit("hot"); err == nil {
		t.Error("an unknown name was accepted")
	}
	got := nvmlapi.ClocksEventReasonsIn(nvml.ClocksEventReasonGpuIdle | nvml.ClocksThrottleReasonHwSlowdown | 0x400)
	if want := []string{"gpu-idle", "hw-slowdown", "0x400"}; !slices.Equal(got, want) {
		t.Errorf("ClocksEventReasonsIn = %v, want %v", got, want)
	}
	if got := nvmlapi.ClocksEventReasonsIn(0); len(got) != 0 {
		t.Errorf("ClocksEventReasonsIn(0) = %v", got)
	}
}

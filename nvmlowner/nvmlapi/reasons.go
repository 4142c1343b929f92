package nvmlapi

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ClocksEventReason is one bit of nvmlDeviceGetCurrentClocksEventReasons'
// mask (nvml.h, group nvmlClocksEventReasons) under a name for configs,
// logs and the simulator's faults.
type ClocksEventReason struct {
	Name string
	Bit  uint64
	// Doc is nvml.h's one-line description of the bit.
	Doc string
}

// ClocksEventReasons are the reasons nvml.h defines, in bit order
// (nvmlClocksEventReasonAll is their union, 0x1FF). The header warns that
// "more than one bit can be enabled at the same time".
var ClocksEventReasons = []ClocksEventReason{
	{"gpu-idle", nvml.ClocksEventReasonGpuIdle, "nothing is running on the GPU and the clocks are dropping to idle state"},
	{"applications-clocks-setting", nvml.ClocksEventReasonApplicationsClocksSetting, "clocks are set to application-specific values (deprecated: no longer used)"},
	{"sw-power-cap", nvml.ClocksEventReasonSwPowerCap, "clocks optimised not to exceed the current power limit"},
	{"hw-slowdown", nvml.ClocksThrottleReasonHwSlowdown, "hardware slowdown (core clocks reduced by a factor of 2 or more): temperature, power brake or power draw too high"},
	{"sync-boost", nvml.ClocksEventReasonSyncBoost, "the GPU is in a sync boost group and clocks follow its slowest member"},
	{"sw-thermal-slowdown", nvml.ClocksEventReasonSwThermalSlowdown, "software thermal slowdown: GPU or memory temperature at its maximum operating temperature"},
	{"hw-thermal-slowdown", nvml.ClocksThrottleReasonHwThermalSlowdown, "hardware thermal slowdown: temperature too high"},
	{"hw-power-brake-slowdown", nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hardware power brake slowdown: external power brake assertion (e.g. by the power supply)"},
	{"display-clock-setting", nvml.ClocksEventReasonDisplayClockSetting, "clocks limited by the display clock setting"},
}

// ClocksEventReasonBit returns the bit of the reason named name.
func ClocksEventReasonBit(name string) (uint64, error) {
	for _, r := range ClocksEventReasons {
		if r.Name == name {
			return r.Bit, nil
		}
	}
	return 0, fmt.Errorf("unknown clocks event reason %q (known: %s)", name, strings.Join(ClocksEventReasonNames(), ", "))
}

// ClocksEventReasonNames lists the names, in bit order.
func ClocksEventReasonNames() []string {
	names := make([]string, len(ClocksEventReasons))
	for i, r := range ClocksEventReasons {
		names[i] = r.Name
	}
	return names
}

// ClocksEventReasonsIn names the reasons set in mask, in bit order; a bit
// nvml.h does not define is named by its value ("0x200").
func ClocksEventReasonsIn(mask uint64) []string {
	var out []string
	known := uint64(0)
	for _, r := range ClocksEventReasons {
		known |= r.Bit
		if mask&r.Bit != 0 {
			out = append(out, r.Name)
		}
	}
	for b := uint64(1); b != 0; b <<= 1 {
		if mask&b != 0 && known&b == 0 {
			out = append(out, fmt.Sprintf("%#x", b))
		}
	}
	return slices.Clip(out)
}

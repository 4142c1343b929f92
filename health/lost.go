package health

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// lostCheck finds GPUs NVML can no longer reach: ERROR_GPU_IS_LOST (fallen
// off the bus, XID 79) or any other NVML error for the device. It clears
// only when NVML sees the device again, which is also how the other polled
// checks get their handle: a lost GPU is not polled any further.
type lostCheck struct {
	lib nvml.Interface
}

func (c *lostCheck) Name() string { return CheckLost }

// resolve returns the GPU's handle, or nil and a fatal observation.
func (c *lostCheck) resolve(uuid string) (nvml.Device, Observation) {
	o := Observation{DeviceID: uuid, Kind: KindGPU, Check: CheckLost}
	dev, ret := c.lib.DeviceGetHandleByUUID(uuid)
	what := "handle"
	if ret == nvml.SUCCESS {
		// The driver keeps a lost GPU's identity (handle, UUID, PCI
		// info); a memory query has to reach the device.
		_, ret = dev.GetMemoryInfo()
		what = "memory info"
	}
	switch ret {
	case nvml.SUCCESS:
		o.Cleared = true
		return dev, o
	case nvml.ERROR_GPU_IS_LOST:
		o.Reason = "gpu lost (fallen off the bus)"
	case nvml.ERROR_NOT_FOUND:
		o.Reason = "gpu not visible to nvml"
	default:
		o.Reason = fmt.Sprintf("nvml %s: %v", what, ret)
	}
	o.Fatal = true
	return nil, o
}

package health

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlCheck watches NVML itself: if it cannot be initialised or cannot
// count devices, every GPU is unhealthy and the node unfit, so a broken
// driver never leaves a node advertising healthy GPUs. The event watcher
// reports its own failures under the same check with Key "events".
type nvmlCheck struct {
	lib         nvml.Interface
	initialized bool
}

func (c *nvmlCheck) Name() string { return CheckNVML }

// probe returns the node-wide observation and whether device checks may
// run. A node without the NVML library and without GPUs is not faulty.
func (c *nvmlCheck) probe(gpus int) (Observation, bool) {
	o := Observation{DeviceID: NodeID, Check: CheckNVML, Key: "poll"}
	if !c.initialized {
		ret := c.lib.Init()
		if ret != nvml.SUCCESS {
			if gpus == 0 && (ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED) {
				o.Cleared = true
				return o, false
			}
			o.Fatal = true
			o.Reason = fmt.Sprintf("nvml init: %v", ret)
			return o, false
		}
		c.initialized = true
	}
	if _, ret := c.lib.DeviceGetCount(); ret != nvml.SUCCESS {
		o.Fatal = true
		o.Reason = fmt.Sprintf("nvml device count: %v", ret)
		return o, false
	}
	o.Cleared = true
	return o, true
}

package health

import (
	"fmt"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// nvmlObservation is the node-wide verdict on NVML itself from one sampling
// cycle: if the library cannot count its devices (or the call hangs), every
// GPU is unhealthy and the node unfit, so a broken driver never leaves a
// node advertising healthy GPUs. The event watcher reports its own
// failures under the same check with Key "events".
func nvmlObservation(snap *nvmlowner.Snapshot) Observation {
	o := Observation{DeviceID: NodeID, Check: CheckNVML, Key: "poll"}
	if snap.LibErr != nil {
		o.Fatal = true
		o.Reason = fmt.Sprintf("nvml: %v", snap.LibErr)
		return o
	}
	o.Cleared = true
	return o
}

package health

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// remapCheck reads row remapping (Ampere and later): a pending remap needs
// a GPU reset before the memory is trusted again, and a remap failure means
// the GPU has run out of spare rows. Both make the GPU unfit until cleared.
type remapCheck struct{}

func (remapCheck) Name() string { return CheckRemap }

func (remapCheck) CheckDevice(t Target) []Observation {
	_, _, pending, failed, ret := t.Device.GetRemappedRows()
	if ret != nvml.SUCCESS {
		return nil
	}
	return []Observation{
		flag(t.UUID, CheckRemap, "pending", pending, "row remapping pending (reset required)"),
		flag(t.UUID, CheckRemap, "failure", failed, "row remapping failure"),
	}
}

// flag is a fatal observation while bad holds and a cleared one otherwise.
func flag(id, check, key string, bad bool, reason string) Observation {
	return Observation{DeviceID: id, Kind: KindGPU, Check: check, Key: key, Fatal: bad, Cleared: !bad, Reason: reason}
}

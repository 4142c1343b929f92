package preflight

import (
	"fmt"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// gpu is one GPU as the items name it.
type gpu struct {
	index int
	uuid  string
	busID string
	model string
}

func gpuOf(g topology.GPU) gpu {
	return gpu{index: g.Index, uuid: g.UUID, busID: g.PCIBusID, model: g.Model}
}

// target is "GPU 3 (0000:1b:00.0)", the UUID standing in for an unknown
// bus ID.
func (g gpu) target() string {
	id := g.busID
	if id == "" {
		id = g.uuid
	}
	return fmt.Sprintf("GPU %d (%s)", g.index, id)
}

func (g gpu) result(item string, st Status, format string, a ...any) Result {
	return Result{Item: item, Target: g.target(), Device: g.uuid, Status: st, Detail: fmt.Sprintf(format, a...)}
}

// unread is the result of an item whose reading v has no value: skipped
// when the GPU does not give it (nvml.h NOT_SUPPORTED, NO_PERMISSION: no
// data, never a fault), failed when the read failed. ok is true when v
// has a value.
func unread(item string, g gpu, what string, v nvmlowner.Value) (Result, bool) {
	switch v.Status {
	case nvmlowner.OK:
		return Result{}, true
	case nvmlowner.NotSupported:
		return g.result(item, Skipped, "%s not supported on this GPU (NOT_SUPPORTED)", what), false
	case nvmlowner.NoPermission:
		return g.result(item, Skipped, "%s not readable by this process (NO_PERMISSION)", what), false
	case nvmlowner.Failed:
		return g.result(item, Fail, "%s not read: %v", what, v.Err), false
	}
	return g.result(item, Fail, "%s not read", what), false
}

func enabledWord(v uint64) string {
	if v == 1 {
		return "enabled"
	}
	return "disabled"
}

package health

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// checkLost reports a GPU that NVML cannot reach: ERROR_GPU_IS_LOST
// (fallen off the bus, XID 79), ERROR_NOT_FOUND (no longer enumerated), or
// calls that did not return within the call timeout (a hung GPU). Each
// clears once a sample of the GPU succeeds again. Library-wide failures
// (the device count failing) are the nvml check's, not a GPU's.
func checkLost(in *checkInput, out *checkResult) {
	err := in.Cur.Err
	lost, timedOut := in.Cur.Lost(), in.Cur.TimedOut()
	if err != nil && !lost && !timedOut {
		// A library failure (or the agent stopping): no verdict on
		// this GPU.
		return
	}
	reason := ""
	switch {
	case errors.Is(err, nvml.ERROR_GPU_IS_LOST):
		reason = "gpu lost (fallen off the bus)"
	case lost:
		reason = "gpu not visible to nvml"
	}
	out.add(flag(in.UUID, CheckLost, "", lost, reason))
	var why string
	if timedOut {
		why = fmt.Sprintf("nvml calls hang: %v", err)
	}
	out.add(flag(in.UUID, CheckTimeout, "", timedOut, why))
}

package health

import (
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// checkReset reports evidence, read from NVML, that a GPU was reset or its
// driver reloaded since the previous sample. Such evidence releases the
// faults held until a reset (reset-class XIDs, double-bit ECC). What counts:
//   - the volatile ECC counters dropping: nvml.h (nvmlEccCounterType_t)
//     says volatile counts "are reset each time the driver loads"; a GPU
//     reset clears them too;
//   - the volatile DBE count below its persisted baseline (the same, seen
//     across an agent restart);
//   - the total energy counter dropping: it counts "since the driver was
//     last reloaded" (nvml.h, nvmlDeviceGetTotalEnergyConsumption);
//   - the driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
//     returning to NONE after asking for a reset or reboot;
//   - a pending row remap or page retirement no longer pending: both
//     complete only at the next reset (nvml.h, nvmlDeviceGetRemappedRows,
//     nvmlDeviceGetRetiredPagesPendingStatus);
//   - a GPU answering again after NVML reported it lost.
//
// A new boot ID (a reboot resets every GPU) and an operator's clear are
// handled by the monitor. A reset that leaves none of these traces (no ECC
// errors counted, no energy counter, a driver without the recovery-action
// field) is not seen: the fault then holds until the operator clears it.
func checkReset(in *checkInput, out *checkResult) {
	var why []string
	drop := func(f nvmlowner.Field, what string) {
		p, ok1 := ok(in.Prev, f)
		c, ok2 := ok(in.Cur, f)
		if ok1 && ok2 && c < p {
			why = append(why, what)
		}
	}
	drop(nvmlowner.FieldECCDBEVolatile, "volatile double-bit ECC count dropped")
	drop(nvmlowner.FieldECCSBEVolatile, "volatile single-bit ECC count dropped")
	drop(nvmlowner.FieldTotalEnergy, "energy counter restarted")
	drop(nvmlowner.FieldRemapPending, "pending row remap completed")
	drop(nvmlowner.FieldRetiredPending, "pending page retirement completed")
	if in.Prev == nil {
		if base, seen := in.Baselines[baselineDBE]; seen {
			if c, has := ok(in.Cur, nvmlowner.FieldECCDBEVolatile); has && c < base {
				why = append(why, "volatile double-bit ECC count below its baseline")
			}
		}
	}
	if p, ok1 := ok(in.Prev, nvmlowner.FieldRecoveryAction); ok1 && nvml.DeviceGpuRecoveryAction(p) != nvml.GPU_RECOVERY_ACTION_NONE {
		if c, ok2 := ok(in.Cur, nvmlowner.FieldRecoveryAction); ok2 && nvml.DeviceGpuRecoveryAction(c) == nvml.GPU_RECOVERY_ACTION_NONE {
			why = append(why, "driver recovery action back to none")
		}
	}
	if in.Prev != nil && in.Prev.Lost() && in.Cur.Err == nil {
		why = append(why, "gpu answers again after being lost")
	}
	if len(why) > 0 {
		out.add(Observation{DeviceID: in.UUID, Kind: KindGPU, Check: CheckReset, Reset: true, Reason: strings.Join(why, "; ")})
	}
}

// checkRecoveryAction reads the driver's own verdict on a GPU
// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, nvml.h nvmlDeviceGpuRecoveryAction_t;
// drivers without the field answer NOT_SUPPORTED): a requested GPU reset or
// node reboot makes the GPU unfit and holds until reset evidence; a
// requested P2P drain or IMEX domain recovery makes it unfit while asked.
func checkRecoveryAction(in *checkInput, out *checkResult) {
	a, has := ok(in.Cur, nvmlowner.FieldRecoveryAction)
	if !has {
		return
	}
	var reason string
	hold := false
	switch nvml.DeviceGpuRecoveryAction(a) {
	case nvml.GPU_RECOVERY_ACTION_NONE:
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		reason, hold = "driver requests a gpu reset", true
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		reason, hold = "driver requests a node reboot", true
	case nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		reason = "driver requests draining peer-to-peer traffic"
	default:
		reason = "driver requests recovery action " + strings.TrimSpace(strings.ToLower(recoveryName(a)))
	}
	o := flag(in.UUID, CheckRecovery, "", nvml.DeviceGpuRecoveryAction(a) != nvml.GPU_RECOVERY_ACTION_NONE, reason)
	o.HoldUntilReset = hold
	if o.Fatal {
		o.Action = recoveryAction(a)
	}
	out.add(o)
}

func recoveryName(a uint64) string {
	if nvml.DeviceGpuRecoveryAction(a) == nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN {
		return "recover imex domain"
	}
	return "unknown"
}

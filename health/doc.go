// Package health decides whether each device, and the node, is fit for work.
// Checks (one per file) turn NVML events, polled readings, DCGM incidents
// and kernel log lines (kernlog.go) into observations; a per-device state
// machine with hysteresis turns those into health, persisted under the
// state dir so a restart forgets nothing.
// It says what is fit (Monitor.Fitness); it does not call the API server:
// package kubeapi mirrors fitness onto the Node object.
//
// # Faults held until a reset
//
// A reset- or reboot-class XID (xidtable.go, docs/xids.md), the double-bit
// ECC event and a rising volatile DBE count are held: the device stays
// unhealthy, past any recovery period and across agent restarts, until
// there is evidence that the GPU was reset. Only then does the recovery
// period (with flap damping) start.
//
// # What counts as reset evidence
//
// An Observation with Reset set, from the sample checks, for one GPU (it
// releases that GPU and its MIG devices), when NVML shows:
//   - the volatile ECC counters dropping (nvml.h, nvmlEccCounterType_t:
//     volatile counts are reset each time the driver loads);
//   - the GPU recovery-action field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
//     returning to NVML_GPU_RECOVERY_ACTION_NONE;
//   - the total-energy counter dropping (nvml.h,
//     nvmlDeviceGetTotalEnergyConsumption: "since the driver was last
//     reloaded").
//
// And, handled by the monitor itself: a boot ID
// (<host-root>/proc/sys/kernel/random/boot_id) different from the one the
// state file was written under releases every hold at start; an operator's
// clear (Monitor.ClearFaults, driven by the Node annotation
// gpu-node-agent.io/clear-faults: <uuid>|all) releases the target's holds
// and drops its recovering events. Node-wide holds are released only by a
// reboot or a clear of "all". A reset that leaves none of these traces is
// not seen: the fault then holds until an operator clears it.
package health

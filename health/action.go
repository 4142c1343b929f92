package health

import (
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Actions say what a cause of an unhealthy device asks of an operator: the
// action label of gpu_node_agent_device_unhealthy, on which the alerting
// rules (deploy/prometheus) split. The set is fixed, so the label's
// cardinality is bounded.
const (
	// ActionResetGPU: the cause holds until the GPU is reset (or the node
	// rebooted): a reset-class XID (the XID table's reset class, NVIDIA's
	// catalog bucket RESET_GPU), the double-bit ECC event or a rising
	// volatile DBE count, the driver's recovery action asking for a
	// reset, and row remapping or page retirement pending (both happen
	// only at a reset).
	ActionResetGPU = "reset-gpu"
	// ActionReboot: a reboot-class XID (RESTART_BM, RESTART_VM) or the
	// driver's recovery action asking for a node reboot.
	ActionReboot = "reboot"
	// ActionCheckNVLink: an NVLink-class XID (the catalog's NVLink
	// workflow), an NVLink down or its error counters jumping.
	ActionCheckNVLink = "check-nvlink"
	// ActionRestartApp: an application-class XID that health.fatalXIDs
	// made fatal (by default they are only counted).
	ActionRestartApp = "restart-app"
	// ActionRMA: a row remapping failure or more retired pages than the
	// limit, NVIDIA's criteria for returning the GPU (after its field
	// diagnostic confirms).
	ActionRMA = "rma"
	// ActionInvestigate: no fixed remedy (GPU lost or hung, NVML failing,
	// fabric not ready, GPU processes, DCGM, RDMA ports, ...); the alert's
	// runbook says what to look at. These recover once the condition is
	// gone.
	ActionInvestigate = "investigate"
)

// Actions lists every action, in the order the constants are documented.
func Actions() []string {
	return []string{ActionResetGPU, ActionReboot, ActionCheckNVLink, ActionRestartApp, ActionRMA, ActionInvestigate}
}

// xidAction is the action of a fatal XID of class c.
func xidAction(c XIDClass) string {
	switch c {
	case XIDClassReset:
		return ActionResetGPU
	case XIDClassReboot:
		return ActionReboot
	case XIDClassNVLink:
		return ActionCheckNVLink
	case XIDClassApp:
		return ActionRestartApp
	}
	return ActionInvestigate
}

// actionOf is the action of observation o's cause: the one its check set,
// else the one its check and key imply (defaultAction), else, for an XID
// another source reported (a DCGM policy violation), the XID's class.
func actionOf(o Observation) string {
	if o.Action != "" {
		return o.Action
	}
	if o.XID != 0 && o.Check != CheckXID {
		return xidAction(ClassifyXID(o.XID))
	}
	return defaultAction(o.Check, o.Key, o.HoldUntilReset)
}

// defaultAction is the action a cause's check and key imply; held says
// the cause is held until a reset. It is also how a cause restored from a
// state file written before causes carried an action gets one.
func defaultAction(check, key string, held bool) string {
	switch check {
	case CheckXID:
		if key == "dbe" {
			return ActionResetGPU
		}
		if n, ok := strings.CutPrefix(key, "xid "); ok {
			if x, err := strconv.ParseUint(n, 10, 64); err == nil {
				return xidAction(ClassifyXID(x))
			}
		}
	case CheckECC:
		return ActionResetGPU
	case CheckRemap, CheckRetired:
		switch key {
		case "pending":
			return ActionResetGPU
		case "failure", "limit":
			return ActionRMA
		}
	case CheckNVLink:
		return ActionCheckNVLink
	}
	if held {
		return ActionResetGPU
	}
	return ActionInvestigate
}

// recoveryAction is the action of the driver's recovery action a
// (nvml.h nvmlDeviceGpuRecoveryAction_t, read as the field
// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): GPU_RESET and DRAIN_AND_RESET
// need a GPU reset, NODE_REBOOT a reboot; DRAIN_P2P and anything newer
// have no fixed remedy here.
func recoveryAction(a uint64) string {
	switch nvml.DeviceGpuRecoveryAction(a) {
	case nvml.GPU_RECOVERY_ACTION_GPU_RESET, nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return ActionResetGPU
	case nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return ActionReboot
	}
	return ActionInvestigate
}

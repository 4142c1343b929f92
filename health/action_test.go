package health

import (
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// TestActionOf: every cause's action label, as the checks report them.
// The XID rows follow the XID table's classes (docs/xids.md).
func TestActionOf(t *testing.T) {
	tests := []struct {
		name string
		o    Observation
		want string
	}{
		{"reset-class xid 48", Observation{Check: CheckXID, Key: "xid 48", XID: 48, HoldUntilReset: true}, ActionResetGPU},
		{"reset-class xid 119 (GSP timeout)", Observation{Check: CheckXID, Key: "xid 119", XID: 119, HoldUntilReset: true}, ActionResetGPU},
		{"reboot-class xid 79 (fallen off the bus)", Observation{Check: CheckXID, Key: "xid 79", XID: 79, HoldUntilReset: true}, ActionReboot},
		{"nvlink-class xid 74", Observation{Check: CheckXID, Key: "xid 74", XID: 74}, ActionCheckNVLink},
		{"nvlink5 xid 145", Observation{Check: CheckXID, Key: "xid 145", XID: 145}, ActionCheckNVLink},
		{"app xid 13 made fatal by fatalXIDs", Observation{Check: CheckXID, Key: "xid 13", XID: 13}, ActionRestartApp},
		{"info xid 63 made fatal", Observation{Check: CheckXID, Key: "xid 63", XID: 63}, ActionInvestigate},
		{"xid not in the table", Observation{Check: CheckXID, Key: "xid 999", XID: 999}, ActionInvestigate},
		{"double-bit ECC event", Observation{Check: CheckXID, Key: "dbe", HoldUntilReset: true}, ActionResetGPU},
		{"volatile DBE count rose", Observation{Check: CheckECC, Key: "dbe", HoldUntilReset: true}, ActionResetGPU},
		{"row remap pending", Observation{Check: CheckRemap, Key: "pending"}, ActionResetGPU},
		{"row remap failure", Observation{Check: CheckRemap, Key: "failure"}, ActionRMA},
		{"retired pages pending", Observation{Check: CheckRetired, Key: "pending"}, ActionResetGPU},
		{"retired pages over the limit", Observation{Check: CheckRetired, Key: "limit"}, ActionRMA},
		{"nvlink down", Observation{Check: CheckNVLink, Key: "link 3"}, ActionCheckNVLink},
		{"nvlink errors jump", Observation{Check: CheckNVLink, Key: "link 3 errors"}, ActionCheckNVLink},
		{"dcgm policy xid 95", Observation{Check: CheckDCGM, Key: "policy xid", XID: 95, HoldUntilReset: true}, ActionResetGPU},
		{"dcgm health incident", Observation{Check: CheckDCGM, Key: "health 0x1"}, ActionInvestigate},
		{"gpu lost", Observation{Check: CheckLost}, ActionInvestigate},
		{"nvml timeout", Observation{Check: CheckTimeout}, ActionInvestigate},
		{"fabric not ready", Observation{Check: CheckFabric}, ActionInvestigate},
		{"gpu missing", Observation{Check: CheckMissing}, ActionInvestigate},
		{"nvml failing", Observation{Check: CheckNVML, Key: "poll"}, ActionInvestigate},
		{"zombie", Observation{Check: CheckGPUProcesses, Key: "zombie"}, ActionInvestigate},
		{"rdma port", Observation{Check: "rdma-port"}, ActionInvestigate},
		{"held cause of another check", Observation{Check: "external", HoldUntilReset: true}, ActionResetGPU},
		{"the check's own action wins", Observation{Check: CheckRecovery, HoldUntilReset: true, Action: ActionReboot}, ActionReboot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := actionOf(tc.o)
			if got != tc.want {
				t.Errorf("actionOf(%+v) = %q, want %q", tc.o, got, tc.want)
			}
			if !slices.Contains(Actions(), got) {
				t.Errorf("action %q is not among Actions() %v", got, Actions())
			}
		})
	}
}

// TestRecoveryActionSaysWhatTheDriverAsks: the recovery-action check, whose
// key does not change with the driver's answer, sets the action itself
// (nvml.h nvmlDeviceGpuRecoveryAction_t).
func TestRecoveryActionSaysWhatTheDriverAsks(t *testing.T) {
	for _, tc := range []struct {
		a    nvml.DeviceGpuRecoveryAction
		want string
	}{
		{nvml.GPU_RECOVERY_ACTION_NONE, ""},
		{nvml.GPU_RECOVERY_ACTION_GPU_RESET, ActionResetGPU},
		{nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET, ActionResetGPU},
		{nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, ActionReboot},
		{nvml.GPU_RECOVERY_ACTION_DRAIN_P2P, ActionInvestigate},
	} {
		in := &checkInput{UUID: "GPU-0", Cur: build([]func(*nvmlowner.Sample){set(nvmlowner.FieldRecoveryAction, uint64(tc.a))}),
			Cfg: Config{}.WithDefaults()}
		var out checkResult
		checkRecoveryAction(in, &out)
		if len(out.Obs) != 1 {
			t.Fatalf("recovery action %d: %d observations, want 1", tc.a, len(out.Obs))
		}
		if got := out.Obs[0].Action; got != tc.want {
			t.Errorf("recovery action %d: Action %q, want %q", tc.a, got, tc.want)
		}
	}
}

// TestRestoredCauseGetsAnAction: a state file written before causes carried
// an action (an older agent's) restores each cause with the action its
// check and key imply.
func TestRestoredCauseGetsAnAction(t *testing.T) {
	j := deviceStateJSON{Kind: KindGPU, Causes: map[string]causeJSON{
		"xid/xid 79":        {Reason: "xid 79", Held: true},
		"row-remap/failure": {Reason: "row remapping failure", Active: true},
		"recovery-action":   {Reason: "driver requests a gpu reset", Active: true, Held: true},
		"gpu-lost":          {Reason: "gpu lost", Active: true},
		"nvlink/link 2":     {Reason: "nvlink 2 down", Active: true, Action: ActionCheckNVLink},
	}}
	s := j.state()
	for k, want := range map[string]string{
		"xid/xid 79":        ActionReboot,
		"row-remap/failure": ActionRMA,
		"recovery-action":   ActionResetGPU,
		"gpu-lost":          ActionInvestigate,
		"nvlink/link 2":     ActionCheckNVLink,
	} {
		if got := s.causes[k].action; got != want {
			t.Errorf("restored cause %s: action %q, want %q", k, got, want)
		}
	}
	if got := s.toJSON().Causes["row-remap/failure"].Action; got != ActionRMA {
		t.Errorf("written back: action %q, want %q", got, ActionRMA)
	}
}

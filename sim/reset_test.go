package sim

import (
	"encoding/binary"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// recoveryAction reads FI_DEV_GET_GPU_RECOVERY_ACTION of d, together with
// a field counters.go answers, so the field-values chain is checked too.
func recoveryAction(t *testing.T, d nvmlapi.Device) nvml.DeviceGpuRecoveryAction {
	t.Helper()
	fvs := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}, {FieldId: nvml.FI_DEV_MEMORY_TEMP}}
	if ret := d.GetFieldValues(fvs); ret != nvml.SUCCESS {
		t.Fatalf("GetFieldValues: %v", ret)
	}
	if ret := nvml.Return(fvs[1].NvmlReturn); ret != nvml.SUCCESS {
		t.Fatalf("memory temperature field after the recovery action field: %v", ret)
	}
	fv := fvs[0]
	if ret := nvml.Return(fv.NvmlReturn); ret != nvml.SUCCESS || nvml.ValueType(fv.ValueType) != nvml.VALUE_TYPE_UNSIGNED_INT {
		t.Fatalf("recovery action field: %v, value type %d", ret, fv.ValueType)
	}
	return nvml.DeviceGpuRecoveryAction(binary.NativeEndian.Uint32(fv.Value[:]))
}

func TestDriverVersionHasRecoveryAction(t *testing.T) {
	// Not the agent's NVML: the mock server's own answer.
	v, ret := newFaultNode(t).srv.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	// The field came with the NVML 12.8 header (driver branch R570).
	if major := strings.Split(v, ".")[0]; major < "570" {
		t.Errorf("driver %s predates FI_DEV_GET_GPU_RECOVERY_ACTION (R570)", v)
	}
}

func TestRecoveryAction(t *testing.T) {
	tests := []struct {
		name  string
		fault string
		want  nvml.DeviceGpuRecoveryAction
	}{
		{"healthy", "", nvml.GPU_RECOVERY_ACTION_NONE},
		{"xid 48", `{"kind":"xid","gpu":2,"xid":48}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"xid 79", `{"kind":"xid","gpu":2,"xid":79}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"xid 95", `{"kind":"xid","gpu":2,"xid":95}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"xid 119", `{"kind":"xid","gpu":2,"xid":119}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"xid 120", `{"kind":"xid","gpu":2,"xid":120}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"xid 13 is an application error", `{"kind":"xid","gpu":2,"xid":13}`, nvml.GPU_RECOVERY_ACTION_NONE},
		{"gpu-lost", `{"kind":"gpu-lost","gpu":2}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
		{"ecc-dbe", `{"kind":"ecc-dbe","gpu":2}`, nvml.GPU_RECOVERY_ACTION_GPU_RESET},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFaultNode(t)
			lib := n.NVML()
			dev, _ := lib.DeviceGetHandleByIndex(2)
			other, _ := lib.DeviceGetHandleByIndex(3)
			if tc.fault != "" {
				mustFault(t, n, "POST", tc.fault)
			}
			if tc.name == "gpu-lost" {
				// A lost GPU answers nothing; the action shows once it is
				// reachable again, before the reset.
				if err := n.setGPULost(2, false); err != nil {
					t.Fatal(err)
				}
			}
			if got := recoveryAction(t, dev); got != tc.want {
				t.Errorf("recovery action %d, want %d", got, tc.want)
			}
			if got := recoveryAction(t, other); got != nvml.GPU_RECOVERY_ACTION_NONE {
				t.Errorf("gpu 3 recovery action %d, want NONE", got)
			}
			mustFault(t, n, "POST", `{"kind":"gpu-reset","gpu":2}`)
			if got := recoveryAction(t, dev); got != nvml.GPU_RECOVERY_ACTION_NONE {
				t.Errorf("recovery action after gpu-reset %d, want NONE", got)
			}
		})
	}
}

func TestGPUReset(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		faults  []string
		// before and after check GPU 1 with the faults in place and after
		// a gpu-reset.
		before, after func(t *testing.T, d nvmlapi.Device)
	}{
		{
			name: "volatile ecc back to zero, aggregate kept", profile: "dgx-h100",
			faults: []string{`{"kind":"ecc-dbe","gpu":1}`, `{"kind":"ecc-dbe","gpu":1}`},
			before: func(t *testing.T, d nvmlapi.Device) { wantECC(t, d, 2, 2) },
			after:  func(t *testing.T, d nvmlapi.Device) { wantECC(t, d, 0, 2) },
		},
		{
			name: "pending row remap carried out", profile: "dgx-h100",
			faults: []string{`{"kind":"row-remap-pending","gpu":1}`},
			before: func(t *testing.T, d nvmlapi.Device) { wantRemap(t, d, 1, true, false) },
			after:  func(t *testing.T, d nvmlapi.Device) { wantRemap(t, d, 1, false, false) },
		},
		{
			name: "row remap failure is permanent", profile: "dgx-h100",
			faults: []string{`{"kind":"row-remap-failure","gpu":1}`},
			before: func(t *testing.T, d nvmlapi.Device) { wantRemap(t, d, 1, false, true) },
			after:  func(t *testing.T, d nvmlapi.Device) { wantRemap(t, d, 1, false, true) },
		},
		{
			name: "pending page retired", profile: "dgx-1v",
			faults: []string{`{"kind":"retired-pages-pending","gpu":1}`},
			before: func(t *testing.T, d nvmlapi.Device) { wantRetired(t, d, nvml.FEATURE_ENABLED, 1) },
			after:  func(t *testing.T, d nvmlapi.Device) { wantRetired(t, d, nvml.FEATURE_DISABLED, 1) },
		},
		{
			name: "lost gpu answers again", profile: "dgx-h100",
			faults: []string{`{"kind":"gpu-lost","gpu":1}`},
			before: func(t *testing.T, d nvmlapi.Device) {
				if _, ret := d.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
					t.Errorf("GetMemoryInfo on a lost gpu: %v", ret)
				}
			},
			after: func(t *testing.T, d nvmlapi.Device) {
				if _, ret := d.GetMemoryInfo(); ret != nvml.SUCCESS {
					t.Errorf("GetMemoryInfo after reset: %v", ret)
				}
			},
		},
		{
			name: "nvlinks up again", profile: "dgx-h100",
			faults: []string{`{"kind":"nvlink-down","gpu":1,"link":3}`, `{"kind":"nvlink-down","gpu":1,"link":7}`},
			before: func(t *testing.T, d nvmlapi.Device) { wantLinks(t, d, nvml.FEATURE_DISABLED) },
			after:  func(t *testing.T, d nvmlapi.Device) { wantLinks(t, d, nvml.FEATURE_ENABLED) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(1)
			for _, f := range tc.faults {
				mustFault(t, n, "POST", f)
			}
			tc.before(t, dev)
			mustFault(t, n, "POST", `{"kind":"gpu-reset","gpu":1}`)
			tc.after(t, dev)
		})
	}
}

func TestGPUResetIsNotClearable(t *testing.T) {
	n := newFaultNode(t)
	code, msg := fault(t, n, "DELETE", `{"kind":"gpu-reset","gpu":1}`)
	if code != http.StatusBadRequest || !strings.Contains(msg, "instantaneous") {
		t.Fatalf("DELETE gpu-reset: %d %q, want 400 saying it is instantaneous", code, msg)
	}
}

func wantECC(t *testing.T, d nvmlapi.Device, volatile, aggregate uint64) {
	t.Helper()
	v, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	a, ret2 := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
	if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS || v != volatile || a != aggregate {
		t.Errorf("dbe volatile %d (%v) aggregate %d (%v), want %d and %d", v, ret, a, ret2, volatile, aggregate)
	}
	if sbe, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC); ret != nvml.SUCCESS || sbe != 0 {
		t.Errorf("volatile sbe %d %v, want 0", sbe, ret)
	}
}

func wantRemap(t *testing.T, d nvmlapi.Device, unc int, pending, failed bool) {
	t.Helper()
	_, u, p, f, ret := d.GetRemappedRows()
	if ret != nvml.SUCCESS || u != unc || p != pending || f != failed {
		t.Errorf("remapped rows unc=%d pending=%t failed=%t (%v), want %d %t %t", u, p, f, ret, unc, pending, failed)
	}
}

func wantRetired(t *testing.T, d nvmlapi.Device, pending nvml.EnableState, pages int) {
	t.Helper()
	st, ret := d.GetRetiredPagesPendingStatus()
	got, ret2 := d.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
	if ret != nvml.SUCCESS || ret2 != nvml.SUCCESS || st != pending || len(got) != pages {
		t.Errorf("retired pages pending %v (%v), %d dbe pages (%v); want %v and %d", st, ret, len(got), ret2, pending, pages)
	}
}

func wantLinks(t *testing.T, d nvmlapi.Device, want nvml.EnableState) {
	t.Helper()
	var got []nvml.EnableState
	for _, l := range []int{3, 7} {
		st, ret := d.GetNvLinkState(l)
		if ret != nvml.SUCCESS {
			t.Fatalf("nvlink %d: %v", l, ret)
		}
		got = append(got, st)
	}
	if !slices.Equal(got, []nvml.EnableState{want, want}) {
		t.Errorf("nvlinks 3 and 7: %v, want both %v", got, want)
	}
	if st, _ := d.GetNvLinkState(0); st != nvml.FEATURE_ENABLED {
		t.Errorf("nvlink 0 went down with the others")
	}
}

// TestResetOutcome: the reset-fail and reset-hang faults say how the
// agent's resets of a GPU end until cleared; without them ResetGPU resets
// as gpu-reset does (the recovery action back to NONE), and an unknown GPU
// is an error.
func TestResetOutcome(t *testing.T) {
	n := newFaultNode(t)
	dev, _ := n.NVML().DeviceGetHandleByIndex(2)
	if got := n.ResetOutcome(2); got != "" {
		t.Fatalf("outcome %q without a fault", got)
	}
	for _, tc := range []struct{ kind, want string }{{FaultResetFail, "fail"}, {FaultResetHang, "hang"}} {
		if err := n.InjectFault(Fault{Kind: tc.kind, GPU: 2}); err != nil {
			t.Fatal(err)
		}
		if got := n.ResetOutcome(2); got != tc.want {
			t.Errorf("%s: outcome %q, want %q", tc.kind, got, tc.want)
		}
		if got := n.ResetOutcome(3); got != "" {
			t.Errorf("%s on GPU 2 changed GPU 3's outcome to %q", tc.kind, got)
		}
		if err := n.ClearFault(Fault{Kind: tc.kind, GPU: 2}); err != nil {
			t.Fatal(err)
		}
		if got := n.ResetOutcome(2); got != "" {
			t.Errorf("%s cleared: outcome %q", tc.kind, got)
		}
	}
	if err := n.InjectFault(Fault{Kind: FaultXID, GPU: 2, XID: 48}); err != nil {
		t.Fatal(err)
	}
	if got := recoveryAction(t, dev); got != nvml.GPU_RECOVERY_ACTION_GPU_RESET {
		t.Fatalf("recovery action %d after xid 48", got)
	}
	if err := n.ResetGPU(2); err != nil {
		t.Fatal(err)
	}
	if got := recoveryAction(t, dev); got != nvml.GPU_RECOVERY_ACTION_NONE {
		t.Errorf("recovery action %d after ResetGPU, want NONE", got)
	}
	if err := n.ResetGPU(99); err == nil {
		t.Error("ResetGPU of a GPU the node lacks: no error")
	}
	if i := n.GPUIndex(n.Spec().GPUs[5].UUID); i != 5 {
		t.Errorf("GPUIndex = %d, want 5", i)
	}
}

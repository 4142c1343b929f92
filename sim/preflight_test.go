package sim

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// link reads GPU i's PCIe link as trained and at its maximum.
func link(t *testing.T, lib nvmlapi.Library, i int) [4]int {
	t.Helper()
	d, ret := lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		t.Fatalf("handle %d: %v", i, ret)
	}
	var out [4]int
	for k, f := range []func() (int, nvml.Return){d.GetCurrPcieLinkGeneration, d.GetCurrPcieLinkWidth, d.GetMaxPcieLinkGeneration, d.GetMaxPcieLinkWidth} {
		v, ret := f()
		if ret != nvml.SUCCESS {
			t.Fatalf("gpu %d pcie read %d: %v", i, k, ret)
		}
		out[k] = v
	}
	return out
}

// TestPCIeLinkPerArchitecture: every GPU's link runs at its maximum, the
// generation its architecture and host give (x16 everywhere).
func TestPCIeLinkPerArchitecture(t *testing.T) {
	for profile, gen := range map[string]int{"dgx-1v": 3, "dgx-2": 3, "dgx-a100": 4, "pcie-8gpu": 4, "dgx-h100": 5, "dgx-h200": 5, "dgx-b200": 5} {
		n := newTestNode(t, profile)
		if got, want := link(t, n.NVML(), 0), [4]int{gen, 16, gen, 16}; got != want {
			t.Errorf("%s: gpu 0 link (gen, width, max gen, max width) = %v, want %v", profile, got, want)
		}
	}
}

func TestPCIeDegradedFault(t *testing.T) {
	n := newFaultNode(t)
	lib := n.NVML()
	mustFault(t, n, http.MethodPost, `{"kind":"pcie-degraded","gpu":3}`)
	if got, want := link(t, lib, 3), [4]int{4, 8, 5, 16}; got != want {
		t.Errorf("default degraded link = %v, want %v", got, want)
	}
	if got, want := link(t, lib, 2), [4]int{5, 16, 5, 16}; got != want {
		t.Errorf("another gpu's link = %v, want %v", got, want)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"pcie-degraded","gpu":3,"pcieWidth":4}`)
	if got, want := link(t, lib, 3), [4]int{5, 4, 5, 16}; got != want {
		t.Errorf("width-only degraded link = %v, want %v", got, want)
	}
	mustFault(t, n, http.MethodDelete, `{"kind":"pcie-degraded","gpu":3}`)
	if got, want := link(t, lib, 3), [4]int{5, 16, 5, 16}; got != want {
		t.Errorf("cleared link = %v, want %v", got, want)
	}
	for _, body := range []string{
		`{"kind":"pcie-degraded","gpu":3,"pcieGen":6}`,
		`{"kind":"pcie-degraded","gpu":3,"pcieWidth":12}`,
		`{"kind":"pcie-degraded","gpu":3,"pcieGen":5,"pcieWidth":16}`,
	} {
		code, msg := fault(t, n, http.MethodPost, body)
		if code != http.StatusBadRequest || !strings.Contains(msg, "pcie") {
			t.Errorf("POST %s: %d %q, want 400 naming the field", body, code, msg)
		}
	}
}

func TestECCAndPersistenceFaults(t *testing.T) {
	n := newFaultNode(t)
	lib := n.NVML()
	d, _ := lib.DeviceGetHandleByIndex(1)
	cur, pend, ret := d.GetEccMode()
	if ret != nvml.SUCCESS || cur != nvml.FEATURE_ENABLED || pend != nvml.FEATURE_ENABLED {
		t.Fatalf("healthy ECC mode = %v/%v %v", cur, pend, ret)
	}
	if m, ret := d.GetPersistenceMode(); ret != nvml.SUCCESS || m != nvml.FEATURE_ENABLED {
		t.Fatalf("healthy persistence mode = %v %v", m, ret)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"ecc-disabled","gpu":1}`)
	mustFault(t, n, http.MethodPost, `{"kind":"persistence-disabled","gpu":1}`)
	cur, pend, ret = d.GetEccMode()
	if ret != nvml.SUCCESS || cur != nvml.FEATURE_DISABLED || pend != nvml.FEATURE_DISABLED {
		t.Errorf("ecc-disabled mode = %v/%v %v", cur, pend, ret)
	}
	// nvml.h nvmlDeviceGetTotalEccErrors: "Requires ECC Mode to be enabled."
	if _, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("ECC counters with ECC off: %v, want NOT_SUPPORTED", ret)
	}
	if m, _ := d.GetPersistenceMode(); m != nvml.FEATURE_DISABLED {
		t.Errorf("persistence-disabled mode = %v", m)
	}
	mustFault(t, n, http.MethodDelete, `{"kind":"ecc-disabled","gpu":1}`)
	if _, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret != nvml.SUCCESS {
		t.Errorf("ECC counters after clearing: %v", ret)
	}
}

func TestThrottleFault(t *testing.T) {
	n := newFaultNode(t)
	d, _ := n.NVML().DeviceGetHandleByIndex(2)
	if r, ret := d.GetCurrentClocksEventReasons(); ret != nvml.SUCCESS || r != 0 {
		t.Fatalf("healthy reasons = %#x %v", r, ret)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"throttle","gpu":2}`)
	mustFault(t, n, http.MethodPost, `{"kind":"throttle","gpu":2,"reason":"sw-thermal-slowdown"}`)
	want := uint64(nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSwThermalSlowdown)
	if r, _ := d.GetCurrentClocksEventReasons(); r != want {
		t.Errorf("reasons = %#x, want %#x", r, want)
	}
	if r, _ := d.GetCurrentClocksThrottleReasons(); r != want {
		t.Errorf("the deprecated call's reasons = %#x, want %#x", r, want)
	}
	mustFault(t, n, http.MethodDelete, `{"kind":"throttle","gpu":2}`)
	if r, _ := d.GetCurrentClocksEventReasons(); r != nvml.ClocksEventReasonSwThermalSlowdown {
		t.Errorf("after clearing hw-slowdown: %#x", r)
	}
	if code, msg := fault(t, n, http.MethodPost, `{"kind":"throttle","gpu":2,"reason":"hot"}`); code != http.StatusBadRequest || !strings.Contains(msg, "reason") {
		t.Errorf("unknown reason: %d %q", code, msg)
	}
}

func TestOldDriverFault(t *testing.T) {
	n := newFaultNode(t)
	lib := n.NVML()
	if v, _ := lib.SystemGetDriverVersion(); v != "570.172.08" {
		t.Fatalf("driver %q", v)
	}
	if err := lib.Extensions().LookupSymbol("nvmlDeviceGetCurrentClocksEventReasons"); err != nil {
		t.Fatalf("R570 lacks the event reasons: %v", err)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"old-driver"}`)
	if v, _ := lib.SystemGetDriverVersion(); v != DefaultOldDriver {
		t.Errorf("old driver %q, want %q", v, DefaultOldDriver)
	}
	if got := n.Spec().Host.DriverVersion; got != DefaultOldDriver {
		t.Errorf("spec driver %q", got)
	}
	if err := lib.Extensions().LookupSymbol("nvmlDeviceGetCurrentClocksEventReasons"); err == nil {
		t.Error("R525 exports nvmlDeviceGetCurrentClocksEventReasons")
	}
	if err := lib.Extensions().LookupSymbol("nvmlDeviceGetCurrentClocksThrottleReasons"); err != nil {
		t.Errorf("R525 lacks the throttle reasons: %v", err)
	}
	d, _ := lib.DeviceGetHandleByIndex(0)
	if _, ret := d.GetCurrentClocksEventReasons(); ret != nvml.ERROR_FUNCTION_NOT_FOUND {
		t.Errorf("event reasons on R525: %v", ret)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"old-driver","driverVersion":"550.54.15"}`)
	if v, _ := lib.SystemGetDriverVersion(); v != "550.54.15" {
		t.Errorf("driver %q", v)
	}
	mustFault(t, n, http.MethodDelete, `{"kind":"old-driver"}`)
	if v, _ := lib.SystemGetDriverVersion(); v != "570.172.08" || n.Spec().Host.DriverVersion != v {
		t.Errorf("cleared: driver %q, spec %q", v, n.Spec().Host.DriverVersion)
	}
	if code, msg := fault(t, n, http.MethodPost, `{"kind":"old-driver","driverVersion":"r535"}`); code != http.StatusBadRequest || !strings.Contains(msg, "driverVersion") {
		t.Errorf("bad version: %d %q", code, msg)
	}
}

// TestCommandFaults: the preflight's command runs as configured without
// a fault; command-slow runs it through a shell that sleeps first,
// command-fail through one that fails in its place; both together sleep,
// then fail; clearing restores it; an unconfigured command stays one.
func TestCommandFaults(t *testing.T) {
	n := newFaultNode(t)
	args := []string{"/usr/bin/nvbandwidth", "-t", "0"}
	if got := n.PreflightCommand(args); !slices.Equal(got, args) {
		t.Errorf("no fault: %q", got)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"command-slow","seconds":30}`)
	want := append([]string{"/bin/sh", "-c", `sleep 30; exec "$@"`, "sh"}, args...)
	if got := n.PreflightCommand(args); !slices.Equal(got, want) {
		t.Errorf("command-slow: %q, want %q", got, want)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"command-fail","exitCode":7}`)
	got := n.PreflightCommand(args)
	if len(got) != 4+len(args) || !strings.HasPrefix(got[2], "sleep 30; echo ") || !strings.HasSuffix(got[2], "exit 7") {
		t.Errorf("command-slow and command-fail: %q", got)
	}
	mustFault(t, n, http.MethodDelete, `{"kind":"command-slow"}`)
	mustFault(t, n, http.MethodDelete, `{"kind":"command-fail"}`)
	if got := n.PreflightCommand(args); !slices.Equal(got, args) {
		t.Errorf("cleared: %q", got)
	}
	mustFault(t, n, http.MethodPost, `{"kind":"command-fail"}`)
	if got := n.PreflightCommand(nil); got != nil {
		t.Errorf("no command configured: %q", got)
	}
	if !strings.HasSuffix(n.PreflightCommand(args)[2], "exit 1") {
		t.Errorf("command-fail's default status: %q", n.PreflightCommand(args))
	}
	if code, msg := fault(t, n, http.MethodPost, `{"kind":"command-fail","exitCode":300}`); code != http.StatusBadRequest || !strings.Contains(msg, "exitCode") {
		t.Errorf("bad exit code: %d %q", code, msg)
	}
}

func TestPreflightCallsHangAndLose(t *testing.T) {
	n := newFaultNode(t)
	d, _ := n.NVML().DeviceGetHandleByIndex(4)
	mustFault(t, n, http.MethodPost, `{"kind":"gpu-lost","gpu":4}`)
	if _, ret := d.GetCurrPcieLinkWidth(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost gpu's link width: %v", ret)
	}
	if _, ret := d.GetPersistenceMode(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("lost gpu's persistence: %v", ret)
	}
	calls := n.NVMLCalls()
	if calls["GetCurrPcieLinkWidth"] != 1 || calls["GetPersistenceMode"] != 1 {
		t.Errorf("calls = %v", calls)
	}
}

func TestFaultSetValue(t *testing.T) {
	for _, tc := range []struct {
		kind, value string
		want        Fault
		err         string
	}{
		{kind: FaultPCIeDegraded, value: "4x8", want: Fault{Kind: FaultPCIeDegraded, PCIeGen: 4, PCIeWidth: 8}},
		{kind: FaultPCIeDegraded, value: "x8", want: Fault{Kind: FaultPCIeDegraded, PCIeWidth: 8}},
		{kind: FaultPCIeDegraded, value: "3", want: Fault{Kind: FaultPCIeDegraded, PCIeGen: 3}},
		{kind: FaultPCIeDegraded, value: "gen4", err: "GENxWIDTH"},
		{kind: FaultThrottle, value: "hw-thermal-slowdown", want: Fault{Kind: FaultThrottle, Reason: "hw-thermal-slowdown"}},
		{kind: FaultThrottle, value: "hot", err: "unknown clocks event reason"},
		{kind: FaultOldDriver, value: "535.54.03", want: Fault{Kind: FaultOldDriver, DriverVersion: "535.54.03"}},
		{kind: FaultOldDriver, value: "latest", err: "not a driver version"},
		{kind: FaultGPULost, value: "1", err: "takes no value"},
		{kind: FaultPortDown, value: "mlx5_3", want: Fault{Kind: FaultPortDown, NIC: "mlx5_3"}},
		{kind: FaultNICFlap, value: "mlx5_3", want: Fault{Kind: FaultNICFlap, NIC: "mlx5_3"}},
		{kind: FaultNICErrors, value: "", err: "want the NIC"},
		{kind: FaultNVLinkDown, value: "7", want: Fault{Kind: FaultNVLinkDown, Link: 7}},
		{kind: FaultNVLinkDown, value: "-1", err: "want a link number"},
		{kind: FaultXID, value: "79", want: Fault{Kind: FaultXID, XID: 79}},
		{kind: FaultXID, value: "0", err: "want an XID"},
		{kind: FaultCommandFail, value: "3", want: Fault{Kind: FaultCommandFail, ExitCode: 3}},
		{kind: FaultCommandFail, value: "256", err: "want an exit status from 1 to 255"},
		{kind: FaultCommandSlow, value: "90", want: Fault{Kind: FaultCommandSlow, Seconds: 90}},
		{kind: FaultCommandSlow, value: "1m", err: "want a delay in whole seconds"},
		{kind: FaultMIGCreateFails, value: "CreateComputeInstance", want: Fault{Kind: FaultMIGCreateFails, Call: "CreateComputeInstance"}},
		{kind: FaultMIGCreateFails, value: "ERROR_UNKNOWN", want: Fault{Kind: FaultMIGCreateFails, Ret: "ERROR_UNKNOWN"}},
		{kind: FaultMIGCreateFails, value: "CreateComputeInstance:ERROR_NO_PERMISSION",
			want: Fault{Kind: FaultMIGCreateFails, Call: "CreateComputeInstance", Ret: "ERROR_NO_PERMISSION"}},
		{kind: FaultMIGCreateFails, value: "SetMigMode", err: "want CALL, RET or CALL:RET"},
		{kind: FaultMIGCreateFails, value: "", err: "want CALL, RET or CALL:RET"},
	} {
		f := Fault{Kind: tc.kind}
		err := f.SetValue(tc.value)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s=%s: error %v, want one containing %q", tc.kind, tc.value, err, tc.err)
		case tc.err == "" && (err != nil || f != tc.want):
			t.Errorf("%s=%s: %+v, %v; want %+v", tc.kind, tc.value, f, err, tc.want)
		}
	}
}

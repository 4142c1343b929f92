package sim

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// What the preflight (package preflight) reads and how the simulator
// answers it, per nvml.h (go-nvml v0.13.3-1's copy):
//
//   - nvmlDeviceGetCurrPcieLinkGeneration/Width and
//     nvmlDeviceGetMaxPcieLinkGeneration/Width: "For Fermi or newer fully
//     supported devices", so every simulated architecture; NOT_SUPPORTED
//     only "if PCIe link information is not available". The maximum is the
//     one "possible with this device and system" (a Gen2 device on a Gen1
//     bus reports 1). A healthy GPU's link runs at its maximum; the
//     pcie-degraded fault trains it lower.
//   - nvmlDeviceGetPersistenceMode: "For all products. For Linux only."
//     Enabled (nvidia-persistenced runs on the DGX OS); the
//     persistence-disabled fault turns it off.
//   - nvmlDeviceGetEccMode: "Only applicable to devices with ECC" (every
//     simulated model is a data-centre GPU with HBM ECC); current and
//     pending enabled, both disabled by the ecc-disabled fault. The ECC
//     counters (nvmlDeviceGetTotalEccErrors) "Require ECC Mode to be
//     enabled": NOT_SUPPORTED while it is off.
//   - nvmlDeviceGetCurrentClocksEventReasons: "For all fully supported
//     products"; no reason while healthy (the simulator's GPUs are never
//     idle: counters.go keeps them busy), the throttle fault's reasons
//     otherwise. Its older name, nvmlDeviceGetCurrentClocksThrottleReasons,
//     answers the same mask. The new name is exported from R535 on (gpud,
//     github.com/leptonai/gpud, notes that calling it on an older driver
//     exits the process on the undefined symbol); under an old-driver fault
//     older than R535 LookupSymbol says it is absent and a call answers
//     FUNCTION_NOT_FOUND.
//   - nvmlSystemGetDriverVersion: the node's driver, or the old-driver
//     fault's version.

// pcieMax is the PCIe link the simulated systems train each architecture
// at: x16 at the generation of the GPU and its host. V100 SXM2/SXM3 are
// PCIe Gen3, A100/A30 Gen4, H100/H200 SXM5 Gen5 (NVIDIA's data sheets).
// B200 is a Gen6 device, but the DGX B200's host CPUs (Xeon Emerald
// Rapids) are Gen5, and nvml.h's maximum is the system's: 5. A snapshot of
// an unknown model gets Gen4 x16.
func pcieMax(arch nvml.DeviceArchitecture) (gen, width int) {
	switch arch {
	case nvml.DEVICE_ARCH_VOLTA:
		return 3, 16
	case nvml.DEVICE_ARCH_HOPPER, nvml.DEVICE_ARCH_BLACKWELL:
		return 5, 16
	}
	return 4, 16
}

// DefaultOldDriver is the driver version the old-driver fault reports when
// it names none: R525, older than every minimum a Hopper node would set
// and than R535 (no nvmlDeviceGetCurrentClocksEventReasons).
const DefaultOldDriver = "525.147.05"

// DefaultCommandDelay is how late, in seconds, a command-slow fault
// starts the preflight's command when it names no delay: an hour, past
// any sane command.timeout.
const DefaultCommandDelay = 3600

// PreflightCommand is the preflight's command as the simulated node runs
// it: args unchanged without a command fault; under command-slow a shell
// that sleeps first and then runs args; under command-fail one that says
// so on stderr and exits with the fault's status instead of running them.
// The real exec path (timeout, process-group kill, output tail) judges
// what the shell does. It needs /bin/sh, as the agent's image has.
func (n *Node) PreflightCommand(args []string) []string {
	ps := n.preflight
	ps.mu.Lock()
	exit, delay := ps.cmdExit, ps.cmdDelay
	ps.mu.Unlock()
	if len(args) == 0 || (exit == 0 && delay == 0) {
		return args
	}
	script := ""
	if delay > 0 {
		script = fmt.Sprintf("sleep %d; ", delay)
	}
	if exit > 0 {
		script += fmt.Sprintf("echo 'simulated preflight command failure (sim fault %s)' >&2; exit %d", FaultCommandFail, exit)
	} else {
		script += `exec "$@"`
	}
	return append([]string{"/bin/sh", "-c", script, "sh"}, args...)
}

// laterSymbols are NVML functions younger than some drivers, with the
// driver branch that first exports them.
var laterSymbols = map[string]int{
	"nvmlDeviceGetCurrentClocksEventReasons":    535,
	"nvmlDeviceGetSupportedClocksEventReasons":  535,
	"nvmlDeviceGetCurrentClocksEventReasons_v2": 1 << 30, // not in any driver the simulator knows
}

// preflightState is what the preflight faults change. It has its own
// lock: nothing in it changes the layout.
type preflightState struct {
	mu sync.Mutex
	// driver is the old-driver fault's version ("" when not injected);
	// ownDriver the node's own, which clearing the fault restores to the
	// spec.
	driver, ownDriver string
	gpus              []gpuPreflight
	// cmdExit and cmdDelay are the command faults' exit status and delay
	// in seconds (0: not injected).
	cmdExit, cmdDelay int
}

type gpuPreflight struct {
	maxGen, maxWidth int
	// gen and width are the link as trained: the maximum unless a
	// pcie-degraded fault is injected.
	gen, width     int
	eccOff         bool
	persistenceOff bool
	// reasons are the active clocks event reasons (throttle faults).
	reasons uint64
}

// installPreflight answers the preflight's calls on every GPU. It runs
// after installFaults, whose ECC counters it wraps.
func (n *Node) installPreflight() {
	ps := &preflightState{gpus: make([]gpuPreflight, len(n.devices)), ownDriver: n.spec.Host.DriverVersion}
	n.preflight = ps
	for i, d := range n.devices {
		g := &ps.gpus[i]
		g.maxGen, g.maxWidth = pcieMax(n.gpus[i].cfg.Architecture)
		g.gen, g.width = g.maxGen, g.maxWidth
		read := func() gpuPreflight {
			ps.mu.Lock()
			defer ps.mu.Unlock()
			return ps.gpus[i]
		}
		d.GetCurrPcieLinkGenerationFunc = func() (int, nvml.Return) { return read().gen, nvml.SUCCESS }
		d.GetCurrPcieLinkWidthFunc = func() (int, nvml.Return) { return read().width, nvml.SUCCESS }
		d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return read().maxGen, nvml.SUCCESS }
		d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return read().maxWidth, nvml.SUCCESS }
		d.GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
			if read().persistenceOff {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		d.GetEccModeFunc = func() (nvml.EnableState, nvml.EnableState, nvml.Return) {
			if read().eccOff {
				return nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.FEATURE_ENABLED, nvml.SUCCESS
		}
		if counts := d.GetTotalEccErrorsFunc; counts != nil {
			d.GetTotalEccErrorsFunc = func(t nvml.MemoryErrorType, c nvml.EccCounterType) (uint64, nvml.Return) {
				if read().eccOff {
					return 0, nvml.ERROR_NOT_SUPPORTED
				}
				return counts(t, c)
			}
		}
		d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, nvml.Return) { return read().reasons, nvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			if !n.hasSymbol("nvmlDeviceGetCurrentClocksEventReasons") {
				return 0, nvml.ERROR_FUNCTION_NOT_FOUND
			}
			return read().reasons, nvml.SUCCESS
		}
	}
}

// driverVersion is the old-driver fault's version, or "" for the node's
// own.
func (n *Node) driverVersion() string {
	ps := n.preflight
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.driver
}

// hasSymbol says whether the simulated driver exports NVML function name.
func (n *Node) hasSymbol(name string) bool {
	since, ok := laterSymbols[name]
	if !ok {
		return true
	}
	n.mu.RLock()
	v := n.spec.Host.DriverVersion
	n.mu.RUnlock()
	major, _, _ := strings.Cut(v, ".")
	m, err := strconv.Atoi(major)
	return err == nil && m >= since
}

// symbols is the simulated library's nvml.ExtendedInterface.
type symbols struct{ n *Node }

// LookupSymbol answers as dlsym would on the simulated driver's library.
func (s symbols) LookupSymbol(name string) error {
	if !strings.HasPrefix(name, "nvml") || !s.n.hasSymbol(name) {
		return fmt.Errorf("symbol %q not found in the simulated libnvidia-ml.so.1", name)
	}
	return nil
}

var _ nvml.ExtendedInterface = symbols{}

// applyPreflightFault injects (on) or clears (!on) one of the preflight
// fault kinds; applyFault has checked the GPU.
func (n *Node) applyPreflightFault(f Fault, on bool) error {
	ps := n.preflight
	switch f.Kind {
	case FaultCommandFail, FaultCommandSlow:
		v := 0
		switch {
		case !on:
		case f.Kind == FaultCommandFail:
			if f.ExitCode < 0 || f.ExitCode > 255 {
				return fmt.Errorf("exitCode: %d is not an exit status from 1 to 255", f.ExitCode)
			}
			v = cmp.Or(f.ExitCode, 1)
		default:
			if f.Seconds < 0 {
				return fmt.Errorf("seconds: %d is negative", f.Seconds)
			}
			v = cmp.Or(f.Seconds, DefaultCommandDelay)
		}
		ps.mu.Lock()
		if f.Kind == FaultCommandFail {
			ps.cmdExit = v
		} else {
			ps.cmdDelay = v
		}
		ps.mu.Unlock()
		return nil
	case FaultOldDriver:
		v := ""
		if on {
			v = f.DriverVersion
			if v == "" {
				v = DefaultOldDriver
			}
			if err := checkDriverVersion(v); err != nil {
				return fmt.Errorf("driverVersion: %w", err)
			}
		}
		ps.mu.Lock()
		ps.driver = v
		ps.mu.Unlock()
		// The layout says what discovery reads (Spec).
		n.mu.Lock()
		n.spec.Host.DriverVersion = cmp.Or(v, ps.ownDriver)
		n.mu.Unlock()
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	g := &ps.gpus[f.GPU]
	switch f.Kind {
	case FaultPCIeDegraded:
		if !on {
			g.gen, g.width = g.maxGen, g.maxWidth
			return nil
		}
		gen, width := f.PCIeGen, f.PCIeWidth
		if gen == 0 && width == 0 {
			// What a marginal riser or retimer typically leaves: one
			// generation down at half the lanes.
			gen, width = g.maxGen-1, g.maxWidth/2
		}
		if gen == 0 {
			gen = g.maxGen
		}
		if width == 0 {
			width = g.maxWidth
		}
		if gen < 1 || gen > g.maxGen {
			return fmt.Errorf("pcieGen: %d is not a generation from 1 to the link's maximum %d", gen, g.maxGen)
		}
		if !validWidth(width) || width > g.maxWidth {
			return fmt.Errorf("pcieWidth: x%d is not a link width (1, 2, 4, 8, 16) up to the link's maximum x%d", width, g.maxWidth)
		}
		if gen == g.maxGen && width == g.maxWidth {
			return fmt.Errorf("pcieGen, pcieWidth: gen %d x%d is the link's maximum, not a degraded link", gen, width)
		}
		g.gen, g.width = gen, width
	case FaultECCDisabled:
		g.eccOff = on
	case FaultPersistenceOff:
		g.persistenceOff = on
	case FaultThrottle:
		reason := f.Reason
		if reason == "" {
			reason = "hw-slowdown"
		}
		bit, err := nvmlapi.ClocksEventReasonBit(reason)
		if err != nil {
			return fmt.Errorf("reason: %w", err)
		}
		if on {
			g.reasons |= bit
		} else {
			g.reasons &^= bit
		}
	default:
		return fmt.Errorf("kind: %q is not a preflight fault", f.Kind)
	}
	return nil
}

func validWidth(w int) bool {
	switch w {
	case 1, 2, 4, 8, 16:
		return true
	}
	return false
}

// checkDriverVersion accepts NVIDIA's driver version form: dot-separated
// numbers, e.g. 535.54.03.
func checkDriverVersion(v string) error {
	parts := strings.Split(v, ".")
	if len(parts) < 2 {
		return fmt.Errorf("%q is not a driver version such as 535.54.03", v)
	}
	for _, p := range parts {
		if _, err := strconv.ParseUint(p, 10, 32); err != nil {
			return fmt.Errorf("%q is not a driver version such as 535.54.03", v)
		}
	}
	return nil
}

// SetValue sets the field a --sim-faults entry's "=VALUE" gives for f's
// kind: pcie-degraded GEN or xWIDTH or GENxWIDTH ("4x8", "x8", "4"),
// throttle a reason name, old-driver a version, port-down, nic-flap and
// nic-errors a NIC ("mlx5_3"), nvlink-down a link number, xid the XID, mig-create-fails
// CALL, RET or CALL:RET ("CreateComputeInstance:ERROR_UNKNOWN"). The
// control API takes the same values as JSON fields (pcieGen, pcieWidth,
// reason, driverVersion, nic, link, xid, call, ret).
func (f *Fault) SetValue(v string) error {
	switch f.Kind {
	case FaultMIGCreateFails:
		call, ret, _ := strings.Cut(v, ":")
		if strings.HasPrefix(call, "ERROR_") && ret == "" {
			call, ret = "", call
		}
		g := *f
		g.Call, g.Ret = call, ret
		if _, err := parseMIGFault(g); err != nil || v == "" {
			return fmt.Errorf("%s=%s: want CALL, RET or CALL:RET such as CreateComputeInstance:ERROR_UNKNOWN", f.Kind, v)
		}
		f.Call, f.Ret = call, ret
	case FaultPortDown, FaultNICFlap, FaultNICErrors:
		if v == "" {
			return fmt.Errorf("%s=: want the NIC, e.g. mlx5_3", f.Kind)
		}
		f.NIC = v
	case FaultNVLinkDown:
		l, err := strconv.Atoi(v)
		if err != nil || l < 0 {
			return fmt.Errorf("%s=%s: want a link number", f.Kind, v)
		}
		f.Link = l
	case FaultXID:
		x, err := strconv.ParseUint(v, 10, 64)
		if err != nil || x == 0 {
			return fmt.Errorf("%s=%s: want an XID such as 79", f.Kind, v)
		}
		f.XID = x
	case FaultPCIeDegraded:
		gen, width, hasWidth := strings.Cut(strings.ToLower(v), "x")
		if gen != "" {
			g, err := strconv.Atoi(gen)
			if err != nil || g < 1 {
				return fmt.Errorf("%s=%s: want GEN, xWIDTH or GENxWIDTH such as 4x8", f.Kind, v)
			}
			f.PCIeGen = g
		}
		if hasWidth {
			w, err := strconv.Atoi(width)
			if err != nil || w < 1 {
				return fmt.Errorf("%s=%s: want GEN, xWIDTH or GENxWIDTH such as 4x8", f.Kind, v)
			}
			f.PCIeWidth = w
		}
		if f.PCIeGen == 0 && f.PCIeWidth == 0 {
			return fmt.Errorf("%s=%s: want GEN, xWIDTH or GENxWIDTH such as 4x8", f.Kind, v)
		}
	case FaultThrottle:
		if _, err := nvmlapi.ClocksEventReasonBit(v); err != nil {
			return fmt.Errorf("%s=%s: %w", f.Kind, v, err)
		}
		f.Reason = v
	case FaultOldDriver:
		if err := checkDriverVersion(v); err != nil {
			return fmt.Errorf("%s=%s: %w", f.Kind, v, err)
		}
		f.DriverVersion = v
	case FaultCommandFail:
		c, err := strconv.Atoi(v)
		if err != nil || c < 1 || c > 255 {
			return fmt.Errorf("%s=%s: want an exit status from 1 to 255", f.Kind, v)
		}
		f.ExitCode = c
	case FaultCommandSlow:
		d, err := strconv.Atoi(v)
		if err != nil || d < 1 {
			return fmt.Errorf("%s=%s: want a delay in whole seconds", f.Kind, v)
		}
		f.Seconds = d
	default:
		return fmt.Errorf("%s=%s: kind %s takes no value", f.Kind, v, f.Kind)
	}
	return nil
}

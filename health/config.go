package health

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// DefaultFatalXIDs returns the XIDs that make a device unfit: every XID
// the XID table (xidtable.go) classes reset, reboot or nvlink, i.e. whose
// resolution bucket in NVIDIA's XID catalog is a GPU reset, a node reboot
// or the NVLink workflow. Application XIDs (13, 31, 43, 45, 68, 109, ...)
// and informational ones (63, 92, 94, ...) are only counted. Each call
// returns a fresh slice, so no caller can change another's defaults.
func DefaultFatalXIDs() []uint64 {
	var out []uint64
	for _, e := range xidTable {
		if e.Class.fatal() {
			out = append(out, e.XID)
		}
	}
	return out
}

// FatalXID says what XID x does under this configuration: whether it
// makes the device unfit (it is in FatalXIDs, or FatalXIDs is empty and
// the table calls it fatal) and, if so, whether it holds the device unfit
// until a reset (the table classes it reset or reboot). A fatal XID that
// does not hold is an event that recovers after the recovery period, as
// is an XID an operator added to FatalXIDs that the table calls app or
// info.
func (c Config) FatalXID(x uint64) (fatal, holdUntilReset bool) {
	class := ClassifyXID(x)
	if len(c.FatalXIDs) == 0 {
		fatal = class.fatal()
	} else {
		fatal = slices.Contains(c.FatalXIDs, x)
	}
	return fatal, fatal && class.holds()
}

// Check names, as used in Observation.Check, metrics and Config.DisabledChecks.
const (
	CheckXID     = "xid"
	CheckECC     = "ecc"
	CheckRetired = "retired-pages"
	CheckRemap   = "row-remap"
	CheckLost    = "gpu-lost"
	CheckNVLink  = "nvlink"
	CheckNVML    = "nvml"
	CheckDCGM    = "dcgm"
	// CheckMissing: NVIDIA GPUs on the PCI bus (or expected by
	// configuration) that NVML does not list (see MissingGPUs).
	CheckMissing = "gpu-missing"
	// CheckGPUProcesses: zombie, leaked and foreign use of a device
	// (package usage reports it; the observation's Key is the class).
	CheckGPUProcesses = "gpu-processes"
	// CheckPreflight: a periodic preflight re-check of an idle GPU failed
	// an item (the agent reports it; the observation's Key is the item).
	// preflight.recheckInterval switches it, not health.disabledChecks.
	CheckPreflight = "preflight"
)

var knownChecks = []string{CheckXID, CheckECC, CheckRetired, CheckRemap, CheckLost, CheckNVLink, CheckNVML, CheckDCGM, CheckMissing, CheckFabric, CheckRecovery, CheckGPUProcesses, CheckKernelLog}

// DCGM modes for Config.DCGMMode.
const (
	DCGMOff        = "off"        // never load libdcgm
	DCGMAuto       = "auto"       // use DCGM if libdcgm.so.4 loads, else NVML only
	DCGMEmbedded   = "embedded"   // embedded hostengine, fail if it cannot start
	DCGMStandalone = "standalone" // connect to DCGMAddress, fail if unreachable
)

// Config is the health monitor's configuration (agent config key `health`).
type Config struct {
	// FatalXIDs are the XIDs that make a device unfit; others are counted.
	// Empty means DefaultFatalXIDs.
	FatalXIDs []uint64 `json:"fatalXIDs,omitempty" yaml:"fatalXIDs,omitempty"`
	// PollInterval is how often the polled checks (ECC, retired pages, row
	// remapping, GPU lost, NVLink, NVML) run. Default 10s.
	PollInterval time.Duration `json:"pollInterval,omitempty" yaml:"pollInterval,omitempty"`
	// RecoveryPeriod is how long every cause of a fault must have stayed
	// clear before the device is healthy again. Default 5m.
	RecoveryPeriod time.Duration `json:"recoveryPeriod,omitempty" yaml:"recoveryPeriod,omitempty"`
	// FlapWindow is how soon after recovering a new fault counts as a flap;
	// each flap within the window doubles the recovery period. Default 1h.
	FlapWindow time.Duration `json:"flapWindow,omitempty" yaml:"flapWindow,omitempty"`
	// MaxRecoveryPeriod caps the damped recovery period. Default 1h.
	MaxRecoveryPeriod time.Duration `json:"maxRecoveryPeriod,omitempty" yaml:"maxRecoveryPeriod,omitempty"`
	// RetiredPagesLimit is the number of retired pages (single + double bit)
	// above which a GPU is unfit. Default 60.
	RetiredPagesLimit int `json:"retiredPagesLimit,omitempty" yaml:"retiredPagesLimit,omitempty"`
	// NVLinkErrorJump is the rise in a link's replay+recovery+CRC error
	// counters within one poll that makes the GPU unfit. Default 100.
	NVLinkErrorJump uint64 `json:"nvlinkErrorJump,omitempty" yaml:"nvlinkErrorJump,omitempty"`
	// DisabledChecks names checks to switch off (see the Check* constants);
	// the nvml check cannot be switched off.
	DisabledChecks []string `json:"disabledChecks,omitempty" yaml:"disabledChecks,omitempty"`
	// DCGMMode is off, auto (default), embedded or standalone.
	DCGMMode string `json:"dcgmMode,omitempty" yaml:"dcgmMode,omitempty"`
	// DCGMAddress is the standalone hostengine (host:port or unix socket);
	// setting it with mode auto selects standalone.
	DCGMAddress string `json:"dcgmAddress,omitempty" yaml:"dcgmAddress,omitempty"`
	// KernelLog is where the kernel-log check reads the kernel log
	// (kernlog.Mode*): auto (default: /dev/kmsg under the host root, else
	// the ring buffer through syslog(2), else the host's journal through
	// its journalctl), kmsg, syslog, journal or off.
	// health.disabledChecks: [kernel-log] also switches it off.
	KernelLog string `json:"kernelLog,omitempty" yaml:"kernelLog,omitempty"`
	// ExpectedGPUs is how many GPUs the node should have; fewer listed by
	// NVML makes the node unfit (gpu-missing). 0 compares with the NVIDIA
	// GPUs on the PCI bus only.
	ExpectedGPUs int `json:"expectedGPUs,omitempty" yaml:"expectedGPUs,omitempty"`
	// Correlation are the rules over rolling windows per device (repeated
	// XIDs escalate, XID pairs cancel) and the NVLink error-rate window
	// (correlate.go, correlate_config.go).
	Correlation CorrelationConfig `json:"correlation,omitzero" yaml:"correlation,omitempty"`

	// StateDir is where the monitor keeps health-state.json so that a
	// restart forgets no fault (agent flag --state-dir); empty disables
	// persistence. Not part of the health config section.
	StateDir string `json:"-" yaml:"-"`
	// HostRoot is where the host's / is mounted (agent --host-root); the
	// boot ID is read from proc/sys/kernel/random/boot_id under it.
	// Empty means /.
	HostRoot string `json:"-" yaml:"-"`

	// MIGDevicesServed says MIG devices are served as devices of their
	// own (agent --mig-strategy single or mixed). When false the kubelet
	// knows only whole GPUs, so an XID tagged with a MIG instance is
	// charged to its GPU. Not part of the health config section.
	MIGDevicesServed bool `json:"-" yaml:"-"`

	// clock replaces the real clock in tests (NewMonitor uses it before
	// a test could set Monitor.clock: the state file is restored there).
	clock clock.WithTicker

	// journalctl replaces the host's journalctl in tests (the kernel-log
	// check's journal source).
	journalctl []string

	// eventWait is the EventSet.Wait timeout; tests shorten it so the
	// watcher notices cancellation and rebuilds quickly.
	eventWait time.Duration
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if len(c.FatalXIDs) == 0 {
		c.FatalXIDs = DefaultFatalXIDs()
	}
	if c.PollInterval == 0 {
		c.PollInterval = 10 * time.Second
	}
	if c.RecoveryPeriod == 0 {
		c.RecoveryPeriod = 5 * time.Minute
	}
	if c.FlapWindow == 0 {
		c.FlapWindow = time.Hour
	}
	if c.MaxRecoveryPeriod == 0 {
		c.MaxRecoveryPeriod = time.Hour
	}
	if c.RetiredPagesLimit == 0 {
		c.RetiredPagesLimit = 60
	}
	if c.NVLinkErrorJump == 0 {
		c.NVLinkErrorJump = 100
	}
	if c.DCGMMode == "" {
		c.DCGMMode = DCGMAuto
	}
	c.Correlation = c.Correlation.withDefaults()
	if c.KernelLog == "" {
		c.KernelLog = kernlog.ModeAuto
	}
	if c.eventWait == 0 {
		c.eventWait = time.Second
	}
	return c
}

// Validate reports every invalid field of c (after defaults).
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.PollInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("health.pollInterval %s: must be at least 100ms", c.PollInterval))
	}
	if c.RecoveryPeriod < 0 {
		errs = append(errs, fmt.Errorf("health.recoveryPeriod %s: must not be negative", c.RecoveryPeriod))
	}
	if c.FlapWindow < 0 {
		errs = append(errs, fmt.Errorf("health.flapWindow %s: must not be negative", c.FlapWindow))
	}
	if c.MaxRecoveryPeriod < c.RecoveryPeriod {
		errs = append(errs, fmt.Errorf("health.maxRecoveryPeriod %s: must be at least recoveryPeriod %s", c.MaxRecoveryPeriod, c.RecoveryPeriod))
	}
	if c.ExpectedGPUs < 0 {
		errs = append(errs, fmt.Errorf("health.expectedGPUs %d: must not be negative", c.ExpectedGPUs))
	}
	if c.RetiredPagesLimit < 0 {
		errs = append(errs, fmt.Errorf("health.retiredPagesLimit %d: must not be negative", c.RetiredPagesLimit))
	}
	for _, x := range c.FatalXIDs {
		if x == 0 {
			errs = append(errs, errors.New("health.fatalXIDs: XID 0 is not an XID"))
		}
	}
	for _, d := range c.DisabledChecks {
		if d == CheckNVML {
			// Without the NVML check a node whose driver is gone reports
			// nothing at all, so every GPU would stay healthy.
			errs = append(errs, fmt.Errorf("health.disabledChecks: %q cannot be disabled: it is what marks every GPU unhealthy when NVML itself fails", d))
			continue
		}
		if !slices.Contains(knownChecks, d) {
			errs = append(errs, fmt.Errorf("health.disabledChecks: unknown check %q (known: %v)", d, knownChecks))
		}
	}
	if !kernlog.ValidMode(c.KernelLog) {
		errs = append(errs, fmt.Errorf("health.kernelLog %q: must be auto, kmsg, syslog, journal or off", c.KernelLog))
	}
	switch c.DCGMMode {
	case DCGMOff, DCGMAuto, DCGMEmbedded:
	case DCGMStandalone:
		if c.DCGMAddress == "" {
			errs = append(errs, errors.New("health.dcgmAddress: required when dcgmMode is standalone"))
		}
	default:
		errs = append(errs, fmt.Errorf("health.dcgmMode %q: must be off, auto, embedded or standalone", c.DCGMMode))
	}
	errs = append(errs, c.Correlation.validate()...)
	return errors.Join(errs...)
}

func (c Config) enabled(check string) bool { return !slices.Contains(c.DisabledChecks, check) }

// Enabled reports whether check is switched on (not in DisabledChecks),
// for checks that run outside this package (CheckGPUProcesses).
func (c Config) Enabled(check string) bool { return c.enabled(check) }

package remediate

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Defaults of Config.
const (
	DefaultResetTimeout       = 2 * time.Minute
	DefaultResetRetryWindow   = time.Hour
	DefaultRetryInterval      = 30 * time.Second
	DefaultSentinelPath       = "/var/run/gpu-node-agent/reboot-required"
	DefaultRebootCondition    = "GPURebootRequired"
	DefaultResetOutputBytes   = 2048
	defaultResetCommandBinary = "nvidia-smi"
)

// PauseAnnotation on the Node pauses every remediation step on it while
// its value is "true": nothing is reset, evicted or requested, and one
// Event says so. Faults stay reported and the taint stays.
const PauseAnnotation = "gpu-node-agent.io/remediation-paused"

// Config is the `remediation` section: each step opt-in, each with a dry
// run that only logs and posts the Event it would.
type Config struct {
	Reset  ResetConfig  `json:"reset,omitzero"`
	Drain  DrainConfig  `json:"drain,omitzero"`
	Reboot RebootConfig `json:"reboot,omitzero"`
	// RetryInterval is how often a step that cannot run yet (a pod still
	// holding the GPU, a PodDisruptionBudget, the fleet safeguard) is
	// looked at again, besides every health, pod and Node change.
	RetryInterval Duration `json:"retryInterval,omitempty"`
}

// ResetConfig is remediation.reset: reset an idle GPU whose fault needs a
// reset.
type ResetConfig struct {
	Enabled bool `json:"enabled,omitempty"`
	DryRun  bool `json:"dryRun,omitempty"`
	// Command is the program (and leading arguments) that resets a GPU;
	// the agent appends "-r -i <PCI bus ID>". Default nvidia-smi from
	// PATH: the driver utilities the NVIDIA container toolkit mounts
	// (NVIDIA_DRIVER_CAPABILITIES=utility). On a host without the
	// toolkit, e.g. ["chroot", "/host", "nvidia-smi"].
	Command []string `json:"command,omitempty"`
	// Timeout bounds one reset; a reset that takes longer is killed and
	// counts as failed.
	Timeout Duration `json:"timeout,omitempty"`
	// RetryWindow: a GPU that needs a reset again within this long of a
	// reset that succeeded is not reset again; it asks for a reboot.
	RetryWindow Duration `json:"retryWindow,omitempty"`
	// AllowMIG lets a GPU with MIG devices be reset: the reset destroys
	// them, and the MIG manager (nvidia-mig-parted) must create them again.
	AllowMIG bool `json:"allowMIG,omitempty"`
}

// DrainConfig is remediation.drain: evict the pods that hold a GPU whose
// fault will not clear while it is in use.
type DrainConfig struct {
	Enabled bool `json:"enabled,omitempty"`
	DryRun  bool `json:"dryRun,omitempty"`
	// GracePeriod overrides the evicted pods' terminationGracePeriodSeconds
	// (unset: the pod's own).
	GracePeriod *Duration `json:"gracePeriod,omitempty"`
}

// RebootConfig is remediation.reboot: ask the cluster's reboot machinery
// (kured's sentinel file, a Node condition for a NodeHealthCheck) to
// reboot the node; the agent never reboots it itself.
type RebootConfig struct {
	Enabled bool `json:"enabled,omitempty"`
	DryRun  bool `json:"dryRun,omitempty"`
	// SentinelPath is the host's file kured watches, written under the
	// host root. Default /var/run/gpu-node-agent/reboot-required, in a
	// directory of the agent's own: kured's own default,
	// /var/run/reboot-required, would need the host's whole /run mounted
	// read-write. Point kured's --reboot-sentinel at it, or keep kured's
	// file for the OS and check both with --reboot-sentinel-command
	// (docs/remediation.md).
	SentinelPath string `json:"sentinelPath,omitempty"`
	// ConditionType is the Node condition set True while a reboot is
	// requested.
	ConditionType string `json:"conditionType,omitempty"`
}

// Enabled says whether any step is on (dry runs included).
func (c Config) Enabled() bool { return c.Reset.Enabled || c.Drain.Enabled || c.Reboot.Enabled }

// WithDefaults returns c with unset fields defaulted.
func (c Config) WithDefaults() Config {
	if len(c.Reset.Command) == 0 {
		c.Reset.Command = []string{defaultResetCommandBinary}
	}
	if c.Reset.Timeout == 0 {
		c.Reset.Timeout = Duration(DefaultResetTimeout)
	}
	if c.Reset.RetryWindow == 0 {
		c.Reset.RetryWindow = Duration(DefaultResetRetryWindow)
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = Duration(DefaultRetryInterval)
	}
	if c.Reboot.SentinelPath == "" {
		c.Reboot.SentinelPath = DefaultSentinelPath
	}
	if c.Reboot.ConditionType == "" {
		c.Reboot.ConditionType = DefaultRebootCondition
	}
	return c
}

// Validate checks c (after WithDefaults) and returns every problem, each
// naming its key.
func (c Config) Validate() error {
	var errs []error
	if c.Reset.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("remediation.reset.timeout %s: must be > 0", c.Reset.Timeout))
	}
	if c.Reset.RetryWindow < 0 {
		errs = append(errs, fmt.Errorf("remediation.reset.retryWindow %s: must be >= 0", c.Reset.RetryWindow))
	}
	for i, a := range c.Reset.Command {
		if a == "" {
			errs = append(errs, fmt.Errorf("remediation.reset.command[%d]: empty", i))
		}
	}
	if c.RetryInterval <= 0 {
		errs = append(errs, fmt.Errorf("remediation.retryInterval %s: must be > 0", c.RetryInterval))
	}
	if g := c.Drain.GracePeriod; g != nil && *g < 0 {
		errs = append(errs, fmt.Errorf("remediation.drain.gracePeriod %s: must be >= 0", *g))
	}
	p := c.Reboot.SentinelPath
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		errs = append(errs, fmt.Errorf("remediation.reboot.sentinelPath %q: must be a clean absolute path of a file", p))
	}
	for _, msg := range validation.IsQualifiedName(c.Reboot.ConditionType) {
		errs = append(errs, fmt.Errorf("remediation.reboot.conditionType %q: %s", c.Reboot.ConditionType, msg))
	}
	if c.Drain.Enabled && !c.Reset.Enabled {
		errs = append(errs, errors.New("remediation.drain.enabled needs remediation.reset.enabled: pods are drained only so that their GPU can be reset"))
	}
	return errors.Join(errs...)
}

// Duration is a time.Duration written as "30s" in the config file.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: want a string such as \"2m\"", b)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d Duration) String() string { return time.Duration(d).String() }

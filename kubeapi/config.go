package kubeapi

import (
	"errors"
	"fmt"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Taint modes for TaintConfig.Mode.
const (
	TaintOff    = "off"     // never touch the Node object
	TaintDryRun = "dry-run" // log the writes that would be made, make none
	TaintOn     = "on"      // taint, set the condition and post events
)

// TaintConfig configures the node tainter (agent config key `taint`,
// flag --taint-mode).
type TaintConfig struct {
	// Mode is off, dry-run or on (default).
	Mode string `json:"mode,omitempty" yaml:"mode,omitempty"`
	// Key is the taint key. Default gpu-node-agent.io/unhealthy.
	Key string `json:"key,omitempty" yaml:"key,omitempty"`
	// Effect is NoSchedule (default), PreferNoSchedule or NoExecute.
	Effect string `json:"effect,omitempty" yaml:"effect,omitempty"`
	// NoExecuteForNodeFaults adds a second taint with the same key and
	// effect NoExecute while the fault is node-wide (NVML failing).
	NoExecuteForNodeFaults bool `json:"noExecuteForNodeFaults,omitempty" yaml:"noExecuteForNodeFaults,omitempty"`
	// ConditionType is the node condition set. Default GPUHealthy.
	ConditionType string `json:"conditionType,omitempty" yaml:"conditionType,omitempty"`
	// MaxFraction is the fleet safeguard: a node may carry the taint only
	// while it holds one of K = max(1, floor(MaxFraction × selected
	// nodes)) slots (Slots), so no more than that fraction of the fleet
	// (and always at least one node) is tainted by agents, however many
	// fail at once. Default 0.2; 1 disables the safeguard.
	MaxFraction float64 `json:"maxFraction,omitempty" yaml:"maxFraction,omitempty"`
	// NodeSelector is the label selector of the fleet the safeguard counts.
	// Default "" (all nodes); set it to the label the agent puts on its nodes.
	NodeSelector string `json:"nodeSelector,omitempty" yaml:"nodeSelector,omitempty"`
	// LeaseNamespace holds the safeguard's slot Leases: the agent's own
	// namespace (the chart passes it). Default "default".
	LeaseNamespace string `json:"leaseNamespace,omitempty" yaml:"leaseNamespace,omitempty"`
	// EventNamespace is where node events are posted. Default "default",
	// where the kubelet posts its node events.
	EventNamespace string `json:"eventNamespace,omitempty" yaml:"eventNamespace,omitempty"`
	// Resync is how often the node informer re-delivers the cached Node
	// so that the tainter and labeler repair drift (no request: the
	// cache is re-checked; a write only when something differs).
	// Default 5m.
	Resync time.Duration `json:"resync,omitempty" yaml:"resync,omitempty"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c TaintConfig) WithDefaults() TaintConfig {
	if c.Mode == "" {
		c.Mode = TaintOn
	}
	if c.Key == "" {
		c.Key = "gpu-node-agent.io/unhealthy"
	}
	if c.Effect == "" {
		c.Effect = "NoSchedule"
	}
	if c.ConditionType == "" {
		c.ConditionType = "GPUHealthy"
	}
	if c.MaxFraction == 0 {
		c.MaxFraction = 0.2
	}
	if c.EventNamespace == "" {
		c.EventNamespace = "default"
	}
	if c.LeaseNamespace == "" {
		c.LeaseNamespace = "default"
	}
	if c.Resync == 0 {
		c.Resync = 5 * time.Minute
	}
	return c
}

// Validate reports every invalid field of c (after defaults).
func (c TaintConfig) Validate() error {
	c = c.WithDefaults()
	var errs []error
	switch c.Mode {
	case TaintOff, TaintDryRun, TaintOn:
	default:
		errs = append(errs, fmt.Errorf("taint.mode %q: must be off, dry-run or on", c.Mode))
	}
	for _, msg := range validation.IsQualifiedName(c.Key) {
		errs = append(errs, fmt.Errorf("taint.key %q: %s", c.Key, msg))
	}
	switch c.Effect {
	case "NoSchedule", "PreferNoSchedule", "NoExecute":
	default:
		errs = append(errs, fmt.Errorf("taint.effect %q: must be NoSchedule, PreferNoSchedule or NoExecute", c.Effect))
	}
	for _, msg := range validation.IsQualifiedName(c.ConditionType) {
		errs = append(errs, fmt.Errorf("taint.conditionType %q: %s", c.ConditionType, msg))
	}
	if c.MaxFraction < 0 || c.MaxFraction > 1 {
		errs = append(errs, fmt.Errorf("taint.maxFraction %g: must be within [0, 1]", c.MaxFraction))
	}
	if _, err := labels.Parse(c.NodeSelector); err != nil {
		errs = append(errs, fmt.Errorf("taint.nodeSelector %q: %w", c.NodeSelector, err))
	}
	for _, msg := range validation.IsDNS1123Label(c.LeaseNamespace) {
		errs = append(errs, fmt.Errorf("taint.leaseNamespace %q: %s", c.LeaseNamespace, msg))
	}
	for _, msg := range validation.IsDNS1123Label(c.EventNamespace) {
		errs = append(errs, fmt.Errorf("taint.eventNamespace %q: %s", c.EventNamespace, msg))
	}
	if c.Resync < time.Second {
		errs = append(errs, fmt.Errorf("taint.resync %s: must be at least 1s", c.Resync))
	}
	return errors.Join(errs...)
}

// ClientConfig bounds the agent's own request rate (client-go's
// client-side token bucket; agent flags --kube-api-qps, --kube-api-burst).
type ClientConfig struct {
	// QPS is the sustained request rate. Default 5 (client-go's).
	QPS float64 `json:"qps,omitempty" yaml:"qps,omitempty"`
	// Burst is how many requests may go at once above QPS. Default 10.
	Burst int `json:"burst,omitempty" yaml:"burst,omitempty"`
}

// WithDefaults returns c with zero fields set to their defaults.
func (c ClientConfig) WithDefaults() ClientConfig {
	if c.QPS == 0 {
		c.QPS = 5
	}
	if c.Burst == 0 {
		c.Burst = 10
	}
	return c
}

// Validate reports every invalid field of c (after defaults).
func (c ClientConfig) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.QPS < 0 {
		errs = append(errs, fmt.Errorf("kube-api-qps %g: must be positive", c.QPS))
	}
	if c.Burst < 1 {
		errs = append(errs, fmt.Errorf("kube-api-burst %d: must be at least 1", c.Burst))
	}
	return errors.Join(errs...)
}

// SafeguardConfig is the configuration of the tainter's Slots (c's
// defaults applied).
func (c TaintConfig) SafeguardConfig() safeguard.Config {
	c = c.WithDefaults()
	return safeguard.Config{Namespace: c.LeaseNamespace, MaxFraction: c.MaxFraction, NodeSelector: c.NodeSelector, TaintKey: c.Key}
}

package rdma

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Resource modes.
const (
	// ModeExclusive advertises one device ID per port/function; a container
	// gets the ports it was allocated and nobody else does.
	ModeExclusive = "exclusive"
	// ModeShared advertises Slots IDs per resource; every container gets
	// all selected devices (k8s-rdma-shared-dev-plugin's rdmaHcaMax model).
	ModeShared = "shared"
)

// DefaultSharedSlots is the slot count of a shared resource that does not
// set one, the same default as rdmaHcaMax.
const DefaultSharedSlots = 1000

// DefaultPollInterval is how often the Watcher rereads port state.
const DefaultPollInterval = time.Second

// Config is the agent's "rdma" configuration section.
type Config struct {
	// AllowExclusiveNetns accepts the RDMA subsystem's exclusive netns mode
	// (see ErrExclusiveNetns); off by default.
	AllowExclusiveNetns bool `json:"allowExclusiveNetns,omitempty" yaml:"allowExclusiveNetns,omitempty"`
	// PollInterval is how often port state is reread (netlink events are
	// handled immediately); 0 means DefaultPollInterval.
	PollInterval Duration `json:"pollInterval,omitempty" yaml:"pollInterval,omitempty"`
	// Resources are the rdma/<name> resources to advertise.
	Resources []ResourceConfig `json:"resources,omitempty" yaml:"resources,omitempty"`
	// PortCounters configures the port error counter check (link
	// flapping, error rates) of the served ports (counters.go).
	PortCounters PortCountersConfig `json:"portCounters,omitempty" yaml:"portCounters,omitempty"`
}

// ResourceConfig is one rdma/<name> resource.
type ResourceConfig struct {
	// Name is the part after "rdma/", e.g. "ib" for rdma/ib.
	Name string `json:"name" yaml:"name"`
	// Mode is "exclusive" (default) or "shared".
	Mode string `json:"mode,omitempty" yaml:"mode,omitempty"`
	// Slots is the number of IDs a shared resource advertises, like
	// rdmaHcaMax; 0 means DefaultSharedSlots. Exclusive resources must
	// leave it 0.
	Slots     int       `json:"slots,omitempty" yaml:"slots,omitempty"`
	Selectors Selectors `json:"selectors" yaml:"selectors"`
}

// Selectors choose ports. Every non-empty field must match (AND); within a
// field any value may match (OR). Empty selectors match every port.
type Selectors struct {
	// Vendors are PCI vendor IDs, e.g. "15b3" (0x prefix optional).
	Vendors []string `json:"vendors,omitempty" yaml:"vendors,omitempty"`
	// DeviceIDs are PCI device IDs, e.g. "101b".
	DeviceIDs []string `json:"deviceIDs,omitempty" yaml:"deviceIDs,omitempty"`
	// Drivers are PCI driver names, e.g. "mlx5_core".
	Drivers []string `json:"drivers,omitempty" yaml:"drivers,omitempty"`
	// IfNames match a netdev of the port or device, e.g. "ib0".
	IfNames []string `json:"ifNames,omitempty" yaml:"ifNames,omitempty"`
	// LinkTypes are "infiniband" (or "ib") and "ethernet" (or "ether",
	// "roce"), matched against ports/N/link_layer.
	LinkTypes []string `json:"linkTypes,omitempty" yaml:"linkTypes,omitempty"`
	// PCIAddresses are BDFs; "0c:00.0" means domain 0000.
	PCIAddresses []string `json:"pciAddresses,omitempty" yaml:"pciAddresses,omitempty"`
	// NUMANodes match the PCI function's NUMA node.
	NUMANodes []int `json:"numaNodes,omitempty" yaml:"numaNodes,omitempty"`
}

// Duration is a time.Duration that reads "5s" from YAML/JSON.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("parse duration %q: %w", b, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// resourceNameRE is a Kubernetes qualified-name "name" part, which the
// part after "rdma/" of an extended resource must be.
var resourceNameRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
})

// Validate checks the section, naming each bad field by its path, e.g.
// `rdma.resources[1].mode: "foo" is not exclusive or shared`.
func (c Config) Validate() error {
	var errs []error
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("rdma.pollInterval: %s is negative", time.Duration(c.PollInterval)))
	}
	if err := c.PortCounters.Validate(); err != nil {
		errs = append(errs, prefixErrors("rdma.portCounters", err))
	}
	seen := map[string]int{}
	for i, r := range c.Resources {
		path := fmt.Sprintf("rdma.resources[%d]", i)
		if err := r.Validate(); err != nil {
			errs = append(errs, prefixErrors(path, err))
		}
		if j, dup := seen[r.Name]; dup && r.Name != "" {
			errs = append(errs, fmt.Errorf("%s.name: %q is already used by rdma.resources[%d]", path, r.Name, j))
		}
		seen[r.Name] = i
	}
	return errors.Join(errs...)
}

// Validate checks one resource; errors name the field relative to the
// resource (e.g. `mode: "foo" is not exclusive or shared`).
func (r ResourceConfig) Validate() error {
	var errs []error
	switch {
	case r.Name == "":
		errs = append(errs, errors.New("name: must not be empty"))
	case len(r.Name) > 63 || !resourceNameRE().MatchString(r.Name):
		errs = append(errs, fmt.Errorf("name: %q is not a valid resource name (alphanumerics, '-', '_', '.', at most 63)", r.Name))
	}
	switch r.Mode {
	case "", ModeExclusive:
		if r.Slots != 0 {
			errs = append(errs, fmt.Errorf("slots: %d is only valid in shared mode", r.Slots))
		}
	case ModeShared:
		if r.Slots < 0 {
			errs = append(errs, fmt.Errorf("slots: %d is negative", r.Slots))
		}
	default:
		errs = append(errs, fmt.Errorf("mode: %q is not exclusive or shared", r.Mode))
	}
	for i, v := range r.Selectors.Vendors {
		if !isHex(normHex(v), 4) {
			errs = append(errs, fmt.Errorf("selectors.vendors[%d]: %q is not a 4-digit hex PCI vendor ID", i, v))
		}
	}
	for i, v := range r.Selectors.DeviceIDs {
		if !isHex(normHex(v), 4) {
			errs = append(errs, fmt.Errorf("selectors.deviceIDs[%d]: %q is not a 4-digit hex PCI device ID", i, v))
		}
	}
	for i, v := range r.Selectors.LinkTypes {
		if linkLayerOf(v) == "" {
			errs = append(errs, fmt.Errorf("selectors.linkTypes[%d]: %q is not infiniband or ethernet", i, v))
		}
	}
	for i, v := range r.Selectors.PCIAddresses {
		if !topology.IsBusID(normBDF(v)) {
			errs = append(errs, fmt.Errorf("selectors.pciAddresses[%d]: %q is not a PCI address like 0000:0c:00.0", i, v))
		}
	}
	for i, v := range r.Selectors.NUMANodes {
		if v < 0 {
			errs = append(errs, fmt.Errorf("selectors.numaNodes[%d]: %d is negative", i, v))
		}
	}
	return errors.Join(errs...)
}

// mode returns the effective mode.
func (r ResourceConfig) mode() string {
	if r.Mode == "" {
		return ModeExclusive
	}
	return r.Mode
}

func (r ResourceConfig) slots() int {
	if r.Slots == 0 {
		return DefaultSharedSlots
	}
	return r.Slots
}

// prefixErrors puts path in front of each joined error.
func prefixErrors(path string, err error) error {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		var out []error
		for _, e := range joined.Unwrap() {
			out = append(out, fmt.Errorf("%s.%w", path, e))
		}
		return errors.Join(out...)
	}
	return fmt.Errorf("%s.%w", path, err)
}

func normHex(s string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "0x")
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}

// normBDF lower-cases a PCI address and adds the 0000 domain when missing.
func normBDF(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	if strings.Count(s, ":") == 1 {
		s = "0000:" + s
	}
	return s
}

// linkLayerOf maps a linkTypes selector value to a link_layer value.
func linkLayerOf(s string) string {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "infiniband", "ib":
		return LinkLayerInfiniBand
	case "ethernet", "ether", "eth", "roce":
		return LinkLayerEthernet
	}
	return ""
}

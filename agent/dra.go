package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// DRAConfig says which devices are served through Dynamic Resource
// Allocation (resource.k8s.io/v1) rather than the device plugin: the
// config file's `dra` section.
type DRAConfig struct {
	// Kinds are the device types served through DRA (dra.TypeGPU,
	// dra.TypeMIG, dra.TypeNIC); the others stay with the device plugin.
	// Empty: DRA is off (unless devices are still held through it, see
	// apiSplit).
	Kinds []string `json:"devices,omitempty"`
	// KubeletDir is the kubelet's root directory, where the plugin's
	// sockets go; empty: the parent of DevicePluginDir.
	KubeletDir string `json:"kubeletDir,omitempty"`
	// CDIDir is where each prepared claim's CDI spec is written; empty:
	// dra.DefaultCDIDir.
	CDIDir string `json:"cdiDir,omitempty"`
	// NoExecute makes the device taint of a node-wide fault (NVML failing)
	// NoExecute, so the device-taint eviction controller evicts the pods
	// using the devices; other faults are always NoSchedule.
	NoExecute bool `json:"noExecute,omitempty"`
	// DeviceMetadata gives every container of a claim a file describing
	// its devices (KEP-5304, alpha in Kubernetes 1.35+): the library
	// writes the attributes the ResourceSlice publishes for each prepared
	// device to a JSON file and a CDI spec that mounts it read-only at
	// /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json.
	DeviceMetadata bool `json:"deviceMetadata,omitempty"`
	// Sharing publishes the GPUs and MIG devices the time-slicing section
	// shares as shared devices (dra.Options.Shares): several claims hold
	// one at once, each one of its replicas' shares by default. Off, DRA
	// serves every device exclusively whatever time-slicing says.
	Sharing bool `json:"sharing,omitempty"`
	// MIGOnDemand publishes every GPU in MIG mode as partitionable devices
	// (KEP-4815, dra.Options.OnDemandMIG): every placement of every
	// profile, whose MIG device is made when a claim for it is prepared
	// and destroyed when the claim is unprepared. Needs mig among the
	// devices. MIG mode stays the operator's: a GPU with MIG mode off is
	// published whole, and MIG devices that exist are left as they are.
	MIGOnDemand bool `json:"migOnDemand,omitempty"`
}

// Validate checks the section, naming the field: known kinds, absolute
// paths, and whole GPUs and MIG devices on one API unless the MIG
// strategy is mixed (under none and single one resource holds both, or a
// GPU in MIG mode would be offered whole by one API and in slices by the
// other).
func (c DRAConfig) Validate(migStrategy string) error {
	var errs []error
	if err := validateKinds(c.Kinds); err != nil {
		errs = append(errs, fmt.Errorf("dra.devices: %w", err))
	}
	if c.KubeletDir != "" && !filepath.IsAbs(c.KubeletDir) {
		errs = append(errs, fmt.Errorf("dra.kubeletDir: %q is not an absolute path", c.KubeletDir))
	}
	if c.CDIDir != "" && !filepath.IsAbs(c.CDIDir) {
		errs = append(errs, fmt.Errorf("dra.cdiDir: %q is not an absolute path", c.CDIDir))
	}
	if slices.Contains(c.Kinds, dra.TypeGPU) != slices.Contains(c.Kinds, dra.TypeMIG) && migStrategy != gpu.MIGStrategyMixed {
		errs = append(errs, fmt.Errorf("dra.devices: gpu and mig must be listed together unless mig-strategy is %s (it is %s)", gpu.MIGStrategyMixed, migStrategy))
	}
	if c.MIGOnDemand && !slices.Contains(c.Kinds, dra.TypeMIG) {
		errs = append(errs, fmt.Errorf("dra.migOnDemand: MIG devices are made on demand only when DRA serves them: add %s to dra.devices", dra.TypeMIG))
	}
	return errors.Join(errs...)
}

// draServer is the agent's DRA driver: the kubelet plugin (the library's
// helper: registration, prepare through the Preparer, device health and
// the node's ResourceSlices), and the split of device kinds between the
// two APIs. It is built when DRA serves a kind or should (the
// configuration, or a kind still held through DRA since an earlier run).
type draServer struct {
	log    *slog.Logger
	split  *apiSplit
	prep   *dra.Preparer
	plugin *dra.KubeletPlugin
	// root resolves the standard pcieRoot attribute, cached per bus ID.
	root *pcieRootCache
	// sharing is the time-slicing section when DRAConfig.Sharing is on.
	sharing *gpu.TimeSlicing
	// migOnDemand is DRAConfig.MIGOnDemand.
	migOnDemand bool
	// nics are the node's RDMA devices now, and rdmaResources the
	// configured RDMA resources: which one each NIC stands for.
	nics          func() []rdma.Device
	rdmaResources []rdma.ResourceConfig

	mu sync.Mutex
	// offered are the monitor IDs of the devices last published healthy.
	offered map[string]bool
	lastErr string
	// shareErr is why the time-slicing section was last not applied.
	shareErr string
	// lastUnread is what Build last could not read (Result.Unread), so
	// that it is logged once.
	lastUnread string
}

// publish hands the reconciler's state to DRA: the devices of the kinds
// DRA serves now, each unhealthy one tainted with its cause, to the slice
// publisher, and their health to the kubelet's health service. It runs on
// the reconciler's goroutine after every pass and health change; equal
// content writes nothing to the API server.
func (s *draServer) publish(st state, snap map[string]health.Status, noExecute bool, drain map[string]bool) {
	if st.node == nil {
		// Nothing discovered yet: publishing now would delete the slices
		// an earlier run left, which still describe the node.
		return
	}
	faults := map[string]dra.Fault{}
	for id, hs := range snap {
		if !hs.Healthy {
			f := faultOf(hs, noExecute)
			if drain[id] {
				// Remediation drains this device's pods for a reset.
				f.Effect = resourceapi.DeviceTaintEffectNoExecute
			}
			faults[id] = f
		}
	}
	shares, err := s.sharing.Shares(st.node)
	if err != nil {
		// As the device plugin refuses the resource: nothing is shared
		// (every device exclusive, which never over-commits one).
		shares = nil
	}
	s.mu.Lock()
	if msg := errString(err); msg != s.shareErr {
		if err != nil {
			s.log.Error("DRA devices published exclusive: the time-slicing section does not fit the node", "err", err)
		}
		s.shareErr = msg
	}
	s.mu.Unlock()
	var nicRes map[string]string
	if s.nics != nil {
		nicRes = rdma.ExclusiveResourceOf(s.nics(), s.rdmaResources)
	}
	res, err := dra.Build(st.node, dra.Options{PCIeRoot: s.root.resolver(st.node), Unhealthy: faults, Shares: shares,
		NICResources: nicRes, OnDemandMIG: s.migOnDemand, Made: s.prep.Made()})
	if err != nil {
		s.mu.Lock()
		if err.Error() != s.lastErr {
			s.log.Error("ResourceSlices not updated", "err", err)
		}
		s.lastErr = err.Error()
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	if unread := strings.Join(res.Unread, "; "); unread != s.lastUnread {
		if unread != "" {
			s.log.Warn("DRA devices published without what could not be read", "unread", unread)
		}
		s.lastUnread = unread
	}
	s.mu.Unlock()
	kinds := s.split.draKinds()
	var devs []resourceapi.Device
	var hs []dra.DeviceHealth
	offered := map[string]bool{}
	for i, d := range res.Devices {
		if !kinds[dra.TypeOf(d.Name)] {
			continue
		}
		devs = append(devs, d)
		id := res.IDs[i]
		h := dra.DeviceHealth{Device: d.Name, Healthy: true}
		if _, bad := faults[id]; bad {
			h.Healthy, h.Message = false, strings.Join(snap[id].Reasons, "; ")
		} else {
			offered[id] = true
		}
		hs = append(hs, h)
	}
	s.mu.Lock()
	if s.lastErr != "" {
		s.log.Info("ResourceSlices follow the devices again")
		s.lastErr = ""
	}
	s.offered = offered
	s.mu.Unlock()
	var counters []resourceapi.CounterSet
	if kinds[dra.TypeMIG] {
		counters = res.CounterSets
	}
	s.plugin.SetDevices(devs, counters)
	s.plugin.SetHealth(hs)
}

// faultOf is the device taint's cause and effect for an unhealthy device:
// its cause codes ("xid-79"; several joined by "."), NoExecute only for a
// node-wide fault when configured.
func faultOf(hs health.Status, noExecute bool) dra.Fault {
	f := dra.Fault{Cause: strings.Join(hs.Causes, ".")}
	if f.Cause == "" {
		f.Cause = "unhealthy"
	}
	if noExecute && hs.NodeWide {
		f.Effect = resourceapi.DeviceTaintEffectNoExecute
	}
	return f
}

// offeredIDs are the monitor IDs of the devices DRA offers healthy now.
func (s *draServer) offeredIDs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offered
}

// withoutMade is n without the MIG devices made for claims (a copy when
// there are any): the node's labels describe the operator's MIG layout,
// so that they, and the Node, do not change with every claim.
func (s *draServer) withoutMade(n *topology.Node) *topology.Node {
	if !s.migOnDemand || n == nil {
		return n
	}
	made := s.prep.Made()
	if len(made) == 0 {
		return n
	}
	c := *n
	c.GPUs = slices.Clone(n.GPUs)
	for i := range c.GPUs {
		c.GPUs[i].MIG = slices.DeleteFunc(slices.Clone(c.GPUs[i].MIG), func(m topology.MIGDevice) bool { return made.Has(c.GPUs[i].UUID, m) })
	}
	return &c
}

// inventory is what the Preparer resolves device names against: the
// devices served now, and only the kinds DRA serves.
func (s *draServer) inventory(rec *reconciler, nics *rdma.NICs) dra.Inventory {
	return dra.Inventory{Node: rec.current().node, RDMA: nics.Devices(), Kinds: s.split.draKinds(), OnDemandMIG: s.migOnDemand}
}

// pcieRootCache remembers each bus ID's PCIe root for one discovered node:
// the sysfs walk behind it runs once per device and discovery, not on
// every health change.
type pcieRootCache struct {
	resolve dra.PCIeRootResolver

	mu    sync.Mutex
	node  *topology.Node
	roots map[string]pcieRoot
}

type pcieRoot struct {
	root string
	err  error
}

func (c *pcieRootCache) resolver(n *topology.Node) dra.PCIeRootResolver {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.node != n {
		c.node, c.roots = n, map[string]pcieRoot{}
	}
	roots := c.roots
	return func(busID string) (string, error) {
		c.mu.Lock()
		r, ok := roots[busID]
		c.mu.Unlock()
		if !ok {
			r.root, r.err = c.resolve(busID)
			c.mu.Lock()
			roots[busID] = r
			c.mu.Unlock()
		}
		return r.root, r.err
	}
}

// kubeletDir is the kubelet's root directory for the DRA sockets.
func (c DRAConfig) kubeletDir(devicePluginDir string) string {
	if c.KubeletDir != "" {
		return c.KubeletDir
	}
	return filepath.Dir(filepath.Clean(devicePluginDir))
}

// validateKinds checks a list of DRA kinds: known and not repeated.
func validateKinds(kinds []string) error {
	seen := map[string]bool{}
	for _, k := range kinds {
		if !slices.Contains(allKinds(), k) {
			return fmt.Errorf("unknown device kind %q (want %s)", k, strings.Join(allKinds(), ", "))
		}
		if seen[k] {
			return fmt.Errorf("device kind %q listed twice", k)
		}
		seen[k] = true
	}
	return nil
}

// allKinds are the device types, in the order decisions are logged.
func allKinds() []string { return []string{dra.TypeGPU, dra.TypeMIG, dra.TypeNIC} }

// splitRetry is how often a refused or half-done move of a device kind
// between the APIs is tried again.
const splitRetry = 10 * time.Second

// openSplit reads which kinds an earlier run served through DRA and
// starts moving them to what the configuration wants.
func (a *Agent) openSplit() (*apiSplit, error) {
	path := ""
	if dir := a.cfg.Health.StateDir; dir != "" {
		path = filepath.Join(dir, ServedFileName)
	}
	if err := validateKinds(a.cfg.DRA.Kinds); err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	prev, err := readServed(path)
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	return newAPISplit(path, prev, a.cfg.DRA.Kinds, a.log.With("component", "dra"), a.reg)
}

// openDRA builds the DRA driver: the Preparer over the checkpoint (a
// corrupt one fails the start: serving without it could prepare a claim
// twice or never clean one up) and the kubelet plugin, which Run starts
// with the API client; then takes the first step of the split, before
// anything is served.
func (a *Agent) openDRA(hostRoot string) (*draServer, error) {
	cfg, log := a.cfg, a.log.With("component", "dra")
	if cfg.NodeName == "" {
		return nil, errors.New("dra: serving devices through DRA needs the node name (its pool)")
	}
	if cfg.Health.StateDir == "" {
		return nil, errors.New("dra: serving devices through DRA needs a state directory (prepared claims are checkpointed there)")
	}
	devPrefix := ""
	if simulated(a.hw) {
		devPrefix = hostRoot // the simulated node's device nodes live there
	}
	s := &draServer{log: log, split: a.split, root: &pcieRootCache{resolve: dra.SysfsPCIeRoot(hostRoot)}}
	if cfg.DRA.Sharing {
		s.sharing = cfg.GPU.TimeSlicing
	}
	var mig dra.MIGMaker
	if cfg.DRA.MIGOnDemand {
		// The placements are published from the MIG profiles discovery
		// reads only when asked.
		d, ok := a.hw.(migProfileReader)
		if !ok {
			return nil, fmt.Errorf("dra.migOnDemand: %s cannot read MIG profiles", describe(a.hw))
		}
		d.SetDiscoverOptions(nvmlowner.DiscoverOptions{MIGProfiles: true})
		s.migOnDemand, mig = true, a.hw.Owner()
	}
	s.nics, s.rdmaResources = a.nics.Devices, cfg.RDMA.Resources
	var err error
	s.prep, err = dra.NewPreparer(dra.PreparerConfig{
		NodeName: cfg.NodeName, HostRoot: hostRoot, CDIDir: cfg.DRA.CDIDir, StateDir: cfg.Health.StateDir,
		HostDevPrefix: devPrefix,
		Inventory:     func() dra.Inventory { return s.inventory(a.rec, a.nics) },
		// A MIG device made or destroyed changes the node: rediscover.
		MIG: mig, Changed: a.Rescan,
		Log: log,
	})
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	s.plugin = dra.NewKubeletPlugin(s.prep, dra.PluginConfig{
		KubeletDir: cfg.DRA.kubeletDir(cfg.DevicePluginDir), NodeName: cfg.NodeName, PodUID: types.UID(cfg.PodUID), Log: log,
		DeviceMetadata: cfg.DRA.DeviceMetadata, CDIDir: cfg.DRA.CDIDir,
	})
	a.split.dpHolders = kubeletHolders(cfg.DevicePluginDir, hostRoot)
	a.split.draHolders = preparedHolders(s.prep)
	if a.node != nil {
		a.split.event = a.node.Event
	}
	a.split.step(true)
	return s, nil
}

// migProfileReader is hardware whose discovery can read the MIG profiles
// of GPUs in MIG mode (nvmlowner.Hardware, and the simulated node through
// it).
type migProfileReader interface {
	SetDiscoverOptions(nvmlowner.DiscoverOptions)
}

// devicePluginResources are the resources of the kinds the device plugin
// serves now.
func (a *Agent) devicePluginResources(rs []plugin.Resource) []plugin.Resource {
	out := make([]plugin.Resource, 0, len(rs))
	for _, r := range rs {
		if a.split.dpServes(resourceKind(r)) {
			out = append(out, r)
		}
	}
	return out
}

// clientsOnce builds the API clients for every part that needs them, once
// it succeeds (a failure is retried by the caller).
type clientsOnce struct {
	build func() (kubeapi.Clients, error)

	mu      sync.Mutex
	clients *kubeapi.Clients
}

func newClientsOnce(cfg Config) *clientsOnce {
	build := cfg.KubeClients
	if build == nil {
		build = func() (kubeapi.Clients, error) {
			return kubeapi.NewClients(cfg.Kubeconfig, "gpu-node-agent/"+cfg.Version, cfg.KubeClient)
		}
	}
	return &clientsOnce{build: build}
}

func (c *clientsOnce) get() (kubeapi.Clients, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.clients != nil {
		return *c.clients, nil
	}
	cl, err := c.build()
	if err != nil {
		return kubeapi.Clients{}, err
	}
	c.clients = &cl
	return cl, nil
}

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

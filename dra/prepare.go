package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// CDI vendor and class of prepared claims: the devices of one claim are
// "gpu-node-agent.io/claim=<claim UID>-<device name>" (device nodes) and
// "gpu-node-agent.io/claim=<claim UID>-request-<request>" (the environment
// of one request's devices), defined in one spec file per claim. The
// vendor is the one rdma's device-plugin CDI spec uses.
const (
	CDIVendor = rdma.CDIVendor
	CDIClass  = "claim"
)

// DefaultCDIDir is the host's directory for transient CDI specs, which
// containerd and CRI-O read by default; the library's kubeletplugin uses
// the same default (DefaultCDIDir in kubeletplugin/metadata.go, v0.37.2).
const DefaultCDIDir = "/var/run/cdi"

// Inventory is the node's devices as Prepare maps allocation results onto
// them: the topology model (device names, as Build publishes them) and the
// RDMA devices (their character devices and ports).
type Inventory struct {
	Node *topology.Node
	RDMA []rdma.Device
	// Kinds are the device types (TypeGPU, TypeMIG, TypeNIC) served
	// through DRA; a device of another kind fails the claim (it is the
	// device plugin's). Nil: every kind.
	Kinds map[string]bool
	// OnDemandMIG says the placement devices of GPUs in MIG mode are
	// published (Options.OnDemandMIG).
	OnDemandMIG bool
}

// ClaimRef names one claim the kubelet asks about.
type ClaimRef struct {
	Namespace, Name, UID string
}

// PreparedDevice is one device of a prepared claim as the kubelet is told.
// It is also the checkpoint's format of a device.
type PreparedDevice struct {
	Requests     []string `json:"requests"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// ShareID is the allocation's share of a shared device (empty for an
	// exclusive one); the kubelet reports it in pod-resources.
	ShareID string `json:"shareID,omitempty"`
	// MIG is the MIG device made for a placement device (nil for any
	// other); Unprepare destroys it.
	MIG *MadeMIG `json:"mig,omitempty"`
}

// MIGPlace is where a MIG device is made on demand: its parent GPU's UUID,
// the GPU instance profile by name and GPU_INSTANCE_PROFILE_* value, and
// the placement.
type MIGPlace struct {
	Parent    string                `json:"parent"`
	Profile   string                `json:"profile"`
	ProfileID int                   `json:"profileID"`
	Placement topology.MIGPlacement `json:"placement"`
}

func (m MIGPlace) valid() bool { return m.Parent != "" && m.Placement.Size > 0 }

func (m MIGPlace) String() string {
	return fmt.Sprintf("%s at slice %d of %s", m.Profile, m.Placement.Start, m.Parent)
}

// MadeMIG is a MIG device made for a claim: where, and what NVML made.
type MadeMIG struct {
	MIGPlace
	UUID            string `json:"uuid"`
	GPUInstance     int    `json:"gi"`
	ComputeInstance int    `json:"ci"`
}

// MIGMaker makes and destroys MIG devices on demand (nvmlowner.Owner's
// MakeMIG and UnmakeMIG): the GPU instance of a GPU_INSTANCE_PROFILE_*
// profile at a placement on the GPU of UUID parent, with the compute
// instance that spans it. Make is all or nothing, except that an error
// wrapping nvmlowner.ErrMaybeMade may have left something there. Unmake
// destroys what is at the placement, only the MIG device of uuid when it
// is given; where nothing is, it succeeds.
type MIGMaker interface {
	MakeMIG(ctx context.Context, parent string, profile int, at topology.MIGPlacement) (topology.MIGDevice, error)
	UnmakeMIG(ctx context.Context, parent string, profile int, at topology.MIGPlacement, uuid string) error
}

// PrepareResult is the answer for one claim: its devices or why not.
type PrepareResult struct {
	Devices []PreparedDevice
	Err     error
}

// PreparerConfig is what a Preparer needs.
type PreparerConfig struct {
	// NodeName is the node's name, which is the pool name of its slices.
	NodeName string
	// HostRoot is the agent's --host-root: device nodes are checked there.
	HostRoot string
	// HostDevPrefix is prepended to GPU device nodes' host paths in the CDI
	// specs: the simulated node's root when simulating, empty on a real
	// node (gpu.HostFiles).
	HostDevPrefix string
	// CDIDir is where claim specs are written; DefaultCDIDir if empty.
	CDIDir string
	// StateDir holds the checkpoint (CheckpointFileName).
	StateDir string
	// Inventory returns the current devices; called once per Prepare.
	Inventory func() Inventory
	// MIG makes and destroys the MIG devices of placement devices
	// (Options.OnDemandMIG); nil: a claim for one fails.
	MIG MIGMaker
	// Changed, if set, is called after a MIG device was made or
	// destroyed, so that the node is rediscovered.
	Changed func()
	Log     *slog.Logger
}

// Preparer prepares and unprepares claims: CDI spec per claim, prepared
// claims checkpointed. The library's kubeletplugin serializes the calls
// (its Serialize option, on by default), across the two instances of a
// rolling update too (a lock file); each call re-reads the checkpoint, so
// a claim the other instance prepared is known here.
type Preparer struct {
	cfg  PreparerConfig
	path string
	cdi  *cdi.Cache

	mu sync.Mutex
	cp *checkpoint
}

// NewPreparer loads the checkpoint. A checkpoint that cannot be read is an
// error wrapping ErrCheckpointCorrupt: the plugin must not serve then.
func NewPreparer(cfg PreparerConfig) (*Preparer, error) {
	if cfg.NodeName == "" || cfg.StateDir == "" || cfg.Inventory == nil {
		return nil, errors.New("dra preparer: node name, state dir and inventory are required")
	}
	if cfg.CDIDir == "" {
		cfg.CDIDir = DefaultCDIDir
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	path := filepath.Join(cfg.StateDir, CheckpointFileName)
	cp, err := readCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.CDIDir, 0o755); err != nil {
		return nil, fmt.Errorf("create cdi dir %s: %w", cfg.CDIDir, err)
	}
	// No auto-refresh: the cache is only used to validate and write specs
	// (atomically, as the CDI library writes them), never to inject.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cfg.CDIDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi cache on %s: %w", cfg.CDIDir, err)
	}
	return &Preparer{cfg: cfg, path: path, cdi: cache, cp: cp}, nil
}

// files is where the GPU device nodes are looked up and found on the host.
func (c PreparerConfig) files() gpu.HostFiles {
	return gpu.HostFiles{HostRoot: c.HostRoot, HostDevPrefix: c.HostDevPrefix}
}

// SpecFile is the CDI spec file name of a claim in the CDI dir, the
// library's transient spec name ("gpu-node-agent.io-claim_<uid>.json").
func SpecFile(claimUID string) string {
	return cdi.GenerateTransientSpecName(CDIVendor, CDIClass, claimUID) + ".json"
}

// Prepared lists the UIDs of the checkpointed claims.
func (p *Preparer) Prepared() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.cp.Claims))
}

// PreparedDevices lists the device names of each checkpointed claim, by
// "<namespace>/<name>".
func (p *Preparer) PreparedDevices() map[string][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string][]string, len(p.cp.Claims))
	for _, c := range p.cp.Claims {
		key := c.Namespace + "/" + c.Name
		for _, d := range c.Devices {
			out[key] = append(out[key], d.Device)
		}
	}
	return out
}

// Prepare prepares each claim (read from the API server by the caller);
// errors are per claim, by UID. A claim already prepared whose spec is
// still on disk gets the checkpointed answer.
func (p *Preparer) Prepare(claims []*resourceapi.ResourceClaim) map[string]PrepareResult {
	out := make(map[string]PrepareResult, len(claims))
	if err := p.reload(); err != nil {
		for _, c := range claims {
			out[string(c.UID)] = PrepareResult{Err: err}
		}
		return out
	}
	p.finishMaking()
	var inv *Inventory
	for _, claim := range claims {
		ref := ClaimRef{Namespace: claim.Namespace, Name: claim.Name, UID: string(claim.UID)}
		p.mu.Lock()
		pc, done := p.cp.Claims[ref.UID]
		p.mu.Unlock()
		if done && p.specExists(ref.UID) {
			out[ref.UID] = PrepareResult{Devices: slices.Clone(pc.Devices)}
			continue
		}
		if inv == nil {
			i := p.cfg.Inventory()
			inv = &i
		}
		devs, err := p.prepareOne(ref, claim, inv, pc)
		if err != nil {
			p.cfg.Log.Warn("dra prepare failed", "claim", ref.Namespace+"/"+ref.Name, "uid", ref.UID, "err", err)
		} else {
			p.cfg.Log.Info("dra claim prepared", "claim", ref.Namespace+"/"+ref.Name, "uid", ref.UID, "devices", len(devs))
		}
		out[ref.UID] = PrepareResult{Devices: devs, Err: err}
	}
	return out
}

// reload re-reads the checkpoint: in a rolling update the other instance
// may have changed it since this one last did. One that cannot be read
// fails the call (fail closed), and the last good one stays in memory.
func (p *Preparer) reload() error {
	cp, err := readCheckpoint(p.path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.cp = cp
	p.mu.Unlock()
	return nil
}

func (p *Preparer) specExists(uid string) bool {
	_, err := os.Stat(filepath.Join(p.cfg.CDIDir, SpecFile(uid)))
	return err == nil
}

func (p *Preparer) prepareOne(ref ClaimRef, claim *resourceapi.ResourceClaim, inv *Inventory, prior preparedClaim) (_ []PreparedDevice, err error) {
	if string(claim.UID) != ref.UID {
		return nil, fmt.Errorf("claim %s/%s has UID %s, not %s: it was replaced", ref.Namespace, ref.Name, claim.UID, ref.UID)
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", ref.Namespace, ref.Name)
	}
	index := deviceIndex(inv)
	// MIG devices made by this call are destroyed again if the claim
	// fails; ones an earlier prepare of the claim made are reused.
	var madeNow []MIGPlace
	defer func() {
		if err != nil {
			p.unmakeAll(madeNow)
		}
	}()
	spec := &cdispec.Spec{Kind: CDIVendor + "/" + CDIClass}
	var devs []PreparedDevice
	reqDevs := map[string][]*namedDevice{} // by base request name
	var reqOrder []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName || r.Pool != p.cfg.NodeName {
			continue // another driver's or another node's device
		}
		d, ok := index[r.Device]
		if !ok {
			return nil, fmt.Errorf("claim %s/%s: device %s is not on this node (any more)", ref.Namespace, ref.Name, r.Device)
		}
		if inv.Kinds != nil && !inv.Kinds[d.kind] {
			return nil, fmt.Errorf("claim %s/%s: device %s is a %s, which this node serves through the device plugin, not DRA", ref.Namespace, ref.Name, r.Device, d.kind)
		}
		var made *MadeMIG
		if d.place != nil {
			made = priorMIG(prior, r.Device)
			if made != nil && !hasMIG(inv.Node, made.UUID) {
				// Gone since (a reboot or a GPU reset destroys MIG
				// devices; the checkpoint outlives them): make it anew.
				made = nil
			}
			if made == nil {
				m, err := p.make(*d.place)
				if err != nil {
					return nil, fmt.Errorf("claim %s/%s: device %s: %w", ref.Namespace, ref.Name, r.Device, err)
				}
				madeNow = append(madeNow, *d.place)
				made = &MadeMIG{MIGPlace: *d.place, UUID: m.UUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance}
			}
			inv.Node = withMIG(inv.Node, *made)
			d = &namedDevice{kind: TypeMIG, id: made.UUID}
		}
		nodes, _, err := d.edits(p.cfg.files(), inv)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: device %s: %w", ref.Namespace, ref.Name, r.Device, err)
		}
		cdiDev := cdispec.Device{Name: ref.UID + "-" + r.Device}
		cdiDev.ContainerEdits.DeviceNodes = deviceNodes(nodes)
		// Two requests of one claim may hold shares of one shared
		// device: its device nodes are one CDI device.
		if !slices.ContainsFunc(spec.Devices, func(x cdispec.Device) bool { return x.Name == cdiDev.Name }) {
			spec.Devices = append(spec.Devices, cdiDev)
		}
		// A sub-request ("gpus/large") answers its parent request.
		req, _, _ := strings.Cut(r.Request, "/")
		if _, seen := reqDevs[req]; !seen {
			reqOrder = append(reqOrder, req)
		}
		reqDevs[req] = append(reqDevs[req], d)
		pd := PreparedDevice{
			Requests: []string{req}, Pool: r.Pool, Device: r.Device,
			CDIDeviceIDs: []string{parser.QualifiedName(CDIVendor, CDIClass, cdiDev.Name)},
		}
		if r.ShareID != nil {
			pd.ShareID = string(*r.ShareID)
		}
		pd.MIG = made
		devs = append(devs, pd)
	}
	// The environment describes all devices of a request together
	// (NVIDIA_VISIBLE_DEVICES lists every GPU of it), so it is one CDI
	// device per request, handed out with the request's first device.
	for _, req := range reqOrder {
		env := map[string]string{}
		for _, kind := range []string{TypeGPU, TypeNIC} {
			var same []*namedDevice
			for _, d := range reqDevs[req] {
				if d.kind == kind || kind == TypeGPU && d.kind == TypeMIG {
					same = append(same, d)
				}
			}
			if len(same) == 0 {
				continue
			}
			_, e, err := editsOf(p.cfg.files(), inv, same)
			if err != nil {
				return nil, fmt.Errorf("claim %s/%s: request %s: %w", ref.Namespace, ref.Name, req, err)
			}
			maps.Copy(env, e)
		}
		cdiDev := cdispec.Device{Name: ref.UID + "-request-" + req}
		for _, k := range slices.Sorted(maps.Keys(env)) {
			cdiDev.ContainerEdits.Env = append(cdiDev.ContainerEdits.Env, k+"="+env[k])
		}
		spec.Devices = append(spec.Devices, cdiDev)
		for i := range devs {
			if devs[i].Requests[0] == req {
				devs[i].CDIDeviceIDs = append(devs[i].CDIDeviceIDs, parser.QualifiedName(CDIVendor, CDIClass, cdiDev.Name))
				break
			}
		}
	}
	if len(devs) == 0 {
		// Nothing of ours on this node: nothing to write or remember.
		return nil, nil
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: cdi spec version: %w", ref.Namespace, ref.Name, err)
	}
	spec.Version = v

	p.mu.Lock()
	defer p.mu.Unlock()
	// Spec first, then the checkpoint: a crash between them leaves a spec
	// the next Prepare overwrites or an Unprepare removes.
	if err := p.cdi.WriteSpec(spec, SpecFile(ref.UID)); err != nil {
		return nil, fmt.Errorf("claim %s/%s: write cdi spec: %w", ref.Namespace, ref.Name, err)
	}
	old, had := p.cp.Claims[ref.UID]
	making := p.cp.Making
	p.cp.Claims[ref.UID] = preparedClaim{Namespace: ref.Namespace, Name: ref.Name, Devices: devs}
	p.cp.Making = slices.DeleteFunc(slices.Clone(making), func(m MIGPlace) bool { return slices.Contains(madeNow, m) })
	if err := writeCheckpoint(p.path, p.cp); err != nil {
		delete(p.cp.Claims, ref.UID)
		if had {
			p.cp.Claims[ref.UID] = old
		}
		p.cp.Making = making
		return nil, fmt.Errorf("claim %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	return devs, nil
}

// priorMIG is the MIG device an earlier prepare of the claim made for
// device, nil if none.
func priorMIG(prior preparedClaim, device string) *MadeMIG {
	for _, d := range prior.Devices {
		if d.Device == device && d.MIG != nil {
			m := *d.MIG
			return &m
		}
	}
	return nil
}

// hasMIG says whether node n lists the MIG device of uuid.
func hasMIG(n *topology.Node, uuid string) bool {
	if n == nil {
		return false
	}
	for _, g := range n.GPUs {
		if slices.ContainsFunc(g.MIG, func(m topology.MIGDevice) bool { return m.UUID == uuid }) {
			return true
		}
	}
	return false
}

// withMIG is n with the made MIG device m added to its parent (a copy: n
// is shared), so that the device edits find it before the next discovery
// does. n is returned as it is when it has m already or lacks the parent.
func withMIG(n *topology.Node, m MadeMIG) *topology.Node {
	if n == nil {
		return n
	}
	for i, g := range n.GPUs {
		if g.UUID != m.Parent {
			continue
		}
		if slices.ContainsFunc(g.MIG, func(d topology.MIGDevice) bool { return d.UUID == m.UUID }) {
			return n
		}
		c := *n
		c.GPUs = slices.Clone(n.GPUs)
		c.GPUs[i].MIG = append(slices.Clone(g.MIG), topology.MIGDevice{
			UUID: m.UUID, Profile: m.Profile, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance,
			Index: len(g.MIG), Placement: m.Placement,
		})
		return &c
	}
	return n
}

// make makes the MIG device at place, recording it in the checkpoint's
// Making first so that a crash during the make cannot leave it unknown.
func (p *Preparer) make(place MIGPlace) (topology.MIGDevice, error) {
	if p.cfg.MIG == nil {
		return topology.MIGDevice{}, errors.New("MIG devices are not made on demand on this node")
	}
	p.mu.Lock()
	p.cp.Making = append(p.cp.Making, place)
	err := writeCheckpoint(p.path, p.cp)
	if err != nil {
		p.cp.Making = p.cp.Making[:len(p.cp.Making)-1]
	}
	p.mu.Unlock()
	if err != nil {
		return topology.MIGDevice{}, fmt.Errorf("make MIG device %s: %w", place, err)
	}
	m, err := p.cfg.MIG.MakeMIG(context.Background(), place.Parent, place.ProfileID, place.Placement)
	if err != nil {
		if errors.Is(err, nvmlowner.ErrMaybeMade) {
			// Something may be there: it stays in Making, for the next
			// call to destroy.
			p.cfg.Log.Warn("MIG device may be left half made; destroyed on the next call", "device", place.String(), "err", err)
		} else {
			p.forgetMaking(place)
		}
		return topology.MIGDevice{}, fmt.Errorf("make MIG device %s: %w", place, err)
	}
	p.cfg.Log.Info("MIG device made", "device", place.String(), "uuid", m.UUID, "gi", m.GPUInstance, "ci", m.ComputeInstance)
	p.changed()
	return m, nil
}

// unmakeAll destroys whatever was made at places (made by this call or
// left by an earlier one, so not known by UUID) and forgets them; one
// that cannot be destroyed stays in Making for the next call to retry.
func (p *Preparer) unmakeAll(places []MIGPlace) {
	for _, m := range places {
		if err := p.unmake(m, ""); err != nil {
			p.cfg.Log.Error("MIG device not destroyed; retried on the next call", "device", m.String(), "err", err)
			continue
		}
		p.forgetMaking(m)
	}
}

// unmake destroys the MIG device at m, only the one of uuid if given.
func (p *Preparer) unmake(m MIGPlace, uuid string) error {
	if p.cfg.MIG == nil {
		return errors.New("MIG devices are not made on demand on this node")
	}
	if err := p.cfg.MIG.UnmakeMIG(context.Background(), m.Parent, m.ProfileID, m.Placement, uuid); err != nil {
		return fmt.Errorf("destroy MIG device %s: %w", m, err)
	}
	p.cfg.Log.Info("MIG device destroyed", "device", m.String())
	p.changed()
	return nil
}

// forgetMaking drops place from the checkpoint's Making.
func (p *Preparer) forgetMaking(place MIGPlace) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.cp.Making, place)
	if i < 0 {
		return
	}
	making := p.cp.Making
	p.cp.Making = slices.Delete(slices.Clone(making), i, i+1)
	if err := writeCheckpoint(p.path, p.cp); err != nil {
		p.cp.Making = making
		p.cfg.Log.Error("dra checkpoint not updated after a MIG device was destroyed", "device", place.String(), "err", err)
	}
}

// finishMaking destroys the MIG devices an earlier call left in Making (a
// crash between the make and the checkpoint): no claim holds them.
func (p *Preparer) finishMaking() {
	p.mu.Lock()
	making := slices.Clone(p.cp.Making)
	p.mu.Unlock()
	if len(making) > 0 {
		p.unmakeAll(making)
	}
}

func (p *Preparer) changed() {
	if p.cfg.Changed != nil {
		p.cfg.Changed()
	}
}

// MadeSet is a set of MIG devices made on demand, by parent GPU UUID,
// profile and placement: what names a MIG device before NVML has made it
// (and so before it has a UUID).
type MadeSet map[MIGKey]bool

// MIGKey names a MIG device by its parent's UUID, profile and first slice.
type MIGKey struct {
	Parent, Profile string
	Start           uint32
}

func (m MIGPlace) key() MIGKey { return MIGKey{m.Parent, m.Profile, m.Placement.Start} }

// Has says whether MIG device m of the GPU of UUID parent is in the set.
func (s MadeSet) Has(parent string, m topology.MIGDevice) bool {
	return m.Placement.Size > 0 && s[MIGKey{parent, m.Profile, m.Placement.Start}]
}

// Made is the set of MIG devices made for prepared claims and those being
// made now (Options.Made): a discovery that runs while one is made finds
// it already in the set, so it is never published as a device of its own.
// The checkpoint is read again first: in a rolling update the other
// instance may have made one.
func (p *Preparer) Made() MadeSet {
	if err := p.reload(); err != nil {
		p.cfg.Log.Warn("dra checkpoint not read again; made MIG devices as last read", "err", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := MadeSet{}
	for _, c := range p.cp.Claims {
		for _, d := range c.Devices {
			if d.MIG != nil {
				out[d.MIG.key()] = true
			}
		}
	}
	for _, m := range p.cp.Making {
		out[m.key()] = true
	}
	return out
}

// Unprepare removes each claim's CDI spec, destroys the MIG devices made
// for it and forgets it; a claim not prepared (or already unprepared) is
// a success. Errors are per claim: one whose MIG device cannot be
// destroyed stays prepared, for the kubelet to retry.
func (p *Preparer) Unprepare(claims []ClaimRef) map[string]error {
	out := make(map[string]error, len(claims))
	if err := p.reload(); err != nil {
		for _, ref := range claims {
			out[ref.UID] = err
		}
		return out
	}
	p.finishMaking()
	for _, ref := range claims {
		out[ref.UID] = p.unprepareOne(ref)
	}
	return out
}

func (p *Preparer) unprepareOne(ref ClaimRef) error {
	// Removed even when the checkpoint does not hold the claim: a crash
	// after writing the spec and before the checkpoint leaves one.
	if err := p.cdi.RemoveSpec(SpecFile(ref.UID)); err != nil {
		return fmt.Errorf("claim %s/%s: remove cdi spec: %w", ref.Namespace, ref.Name, err)
	}
	p.mu.Lock()
	pc, ok := p.cp.Claims[ref.UID]
	p.mu.Unlock()
	if !ok {
		return nil
	}
	var errs []error
	for _, d := range pc.Devices {
		if d.MIG == nil {
			continue
		}
		if err := p.unmake(d.MIG.MIGPlace, d.MIG.UUID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("claim %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.cp.Claims, ref.UID)
	if err := writeCheckpoint(p.path, p.cp); err != nil {
		p.cp.Claims[ref.UID] = pc
		return fmt.Errorf("claim %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	p.cfg.Log.Info("dra claim unprepared", "claim", ref.Namespace+"/"+ref.Name, "uid", ref.UID)
	return nil
}

// namedDevice is a published device name resolved to what backs it.
type namedDevice struct {
	kind string
	// id is the GPU or MIG UUID, or the RDMA device name.
	id string
	// place is where a placement device's MIG device is made (id is
	// empty until it is).
	place *MIGPlace
}

func (d *namedDevice) edits(files gpu.HostFiles, inv *Inventory) ([]*pluginapi.DeviceSpec, map[string]string, error) {
	return editsOf(files, inv, []*namedDevice{d})
}

// editsOf asks gpu or rdma for the device specs and environment of devs,
// all of one kind (GPU and MIG count as one), so the container gets what
// the device plugin's Allocate would give it.
func editsOf(files gpu.HostFiles, inv *Inventory, devs []*namedDevice) ([]*pluginapi.DeviceSpec, map[string]string, error) {
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.id
	}
	if devs[0].kind == TypeNIC {
		return rdma.DeviceEdits(inv.RDMA, ids)
	}
	return gpu.DeviceEdits(files, inv.Node, ids)
}

// deviceIndex maps the device names Build publishes to what backs them.
func deviceIndex(inv *Inventory) map[string]*namedDevice {
	out := map[string]*namedDevice{}
	if inv.Node == nil {
		return out
	}
	for i := range inv.Node.GPUs {
		g := &inv.Node.GPUs[i]
		if !g.MIGEnabled {
			if g.UUID != "" {
				out[GPUName(g.Index)] = &namedDevice{kind: TypeGPU, id: g.UUID}
			}
			continue
		}
		for _, m := range g.MIG {
			out[MIGName(g.Index, m)] = &namedDevice{kind: TypeMIG, id: m.UUID}
		}
		if !inv.OnDemandMIG || g.UUID == "" {
			continue
		}
		for _, prof := range g.MIGProfiles {
			for _, pl := range prof.Placements {
				out[PlacementName(g.Index, prof.Name, pl.Start)] = &namedDevice{kind: TypeMIG, place: &MIGPlace{
					Parent: g.UUID, Profile: prof.Name, ProfileID: prof.ID, Placement: pl,
				}}
			}
		}
	}
	for _, n := range inv.Node.NICs {
		out[NICName(n.Name)] = &namedDevice{kind: TypeNIC, id: n.Name}
	}
	return out
}

func deviceNodes(specs []*pluginapi.DeviceSpec) []*cdispec.DeviceNode {
	out := make([]*cdispec.DeviceNode, 0, len(specs))
	for _, s := range specs {
		out = append(out, &cdispec.DeviceNode{Path: s.ContainerPath, HostPath: s.HostPath, Type: "c", Permissions: s.Permissions})
	}
	return out
}

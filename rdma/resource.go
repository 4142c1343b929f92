package rdma

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// ResourcePrefix is the domain of every RDMA resource: rdma/<name>.
const ResourcePrefix = "rdma/"

// HealthView answers whether a device ID (a port ID, see Device.PortID) is
// healthy; the health monitor implements it.
type HealthView interface {
	Healthy(id string) bool
}

// RecentGPUs reports the GPU UUIDs handed to the most recent container, so
// that an RDMA allocation for the same container can pick the NICs next to
// them. It should return nothing once that allocation is stale (a few
// seconds), since the kubelet allocates a pod's resources back to back.
type RecentGPUs interface {
	RecentAllocation() []string
}

// Option tunes Resources.
type Option func(*options)

type options struct {
	gpus   []topology.GPU
	recent RecentGPUs
}

// WithGPUAffinity lets exclusive resources prefer the NICs nearest to the
// GPUs recent reports, using gpus' PCI paths and NUMA nodes.
func WithGPUAffinity(gpus []topology.GPU, recent RecentGPUs) Option {
	return func(o *options) { o.gpus, o.recent = gpus, recent }
}

// portRef is one selected port: the unit of an exclusive resource.
type portRef struct {
	id   string
	dev  *Device
	port Port
}

// Resources builds one plugin.Resource per config entry, named
// rdma/<name>. Exclusive resources advertise one device per selected port,
// and such a port may be in no other resource. Shared resources (which may
// overlap each other) advertise Slots devices that each give all selected
// ports. health may be nil (everything healthy); cdi switches Allocate to
// CDI device names (CDIVendor/CDIClass=<port ID>, see WriteCDISpec)
// instead of device specs.
func Resources(devs []Device, cfgs []ResourceConfig, health HealthView, cdi bool, opts ...Option) ([]plugin.Resource, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if err := (Config{Resources: cfgs}).Validate(); err != nil {
		return nil, err
	}
	if health == nil {
		health = allHealthy{}
	}
	// A port of an exclusive resource belongs to that resource alone: a
	// shared resource handing it out too would break the exclusivity.
	claimed := map[string]string{} // port ID -> exclusive resource
	users := map[string]string{}   // port ID -> first resource using it
	out := make([]plugin.Resource, 0, len(cfgs))
	for i, cfg := range cfgs {
		refs := matchPorts(devs, cfg)
		name := ResourcePrefix + cfg.Name
		exclusive := cfg.mode() == ModeExclusive
		for _, r := range refs {
			if other, ok := claimed[r.id]; ok {
				return nil, fmt.Errorf("rdma.resources[%d]: port %s is already in exclusive resource %s", i, r.id, other)
			}
			if other, ok := users[r.id]; ok && exclusive {
				return nil, fmt.Errorf("rdma.resources[%d]: exclusive resource %s selects port %s, which resource %s also uses", i, name, r.id, other)
			}
			if exclusive {
				claimed[r.id] = name
			}
			if _, ok := users[r.id]; !ok {
				users[r.id] = name
			}
		}
		base := baseResource{name: name, ports: refs, health: health, cdi: cdi}
		if !exclusive {
			out = append(out, &sharedResource{baseResource: base, slots: cfg.slots()})
			continue
		}
		ex := &exclusiveResource{baseResource: base, byID: map[string]portRef{}, gpus: o.gpus, recent: o.recent}
		for _, r := range refs {
			ex.byID[r.id] = r
		}
		out = append(out, ex)
	}
	return out, nil
}

type allHealthy struct{}

func (allHealthy) Healthy(string) bool { return true }

type baseResource struct {
	name   string
	ports  []portRef
	health HealthView
	cdi    bool
}

// Name implements plugin.Resource.
func (r *baseResource) Name() string { return r.name }

// exclusiveResource gives each port to one container at a time.
type exclusiveResource struct {
	baseResource
	byID   map[string]portRef
	gpus   []topology.GPU
	recent RecentGPUs
}

// Devices implements plugin.Resource.
func (r *exclusiveResource) Devices() []plugin.Device {
	out := make([]plugin.Device, 0, len(r.ports))
	for _, p := range r.ports {
		out = append(out, plugin.Device{ID: p.id, Healthy: r.health.Healthy(p.id), NUMANodes: numaOf(p.dev.PCI.NUMANode)})
	}
	return out
}

// Allocate implements plugin.Resource.
func (r *exclusiveResource) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	refs := make([]portRef, 0, len(ids))
	for _, id := range ids {
		p, ok := r.byID[id]
		if !ok {
			return nil, fmt.Errorf("allocate %s: unknown device %q", r.name, id)
		}
		refs = append(refs, p)
	}
	return containerResponse(refs, r.cdi), nil
}

// sharedResource advertises slots; each slot gives every selected port.
type sharedResource struct {
	baseResource
	slots int
}

// Devices implements plugin.Resource. A resource that selected no port
// advertises nothing. Slots are unhealthy while any selected port is, so
// no new pod is placed on a node where it would miss a rail.
func (r *sharedResource) Devices() []plugin.Device {
	if len(r.ports) == 0 {
		return nil
	}
	healthy := true
	var numa []int64
	for _, p := range r.ports {
		if !r.health.Healthy(p.id) {
			healthy = false
		}
		for _, n := range numaOf(p.dev.PCI.NUMANode) {
			if !slices.Contains(numa, n) {
				numa = append(numa, n)
			}
		}
	}
	slices.Sort(numa)
	out := make([]plugin.Device, r.slots)
	for i := range out {
		out[i] = plugin.Device{ID: r.slotID(i), Healthy: healthy, NUMANodes: numa}
	}
	return out
}

func (r *sharedResource) slotID(i int) string {
	return r.name[len(ResourcePrefix):] + "-" + strconv.Itoa(i)
}

// Allocate implements plugin.Resource.
func (r *sharedResource) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if len(r.ports) == 0 {
		return nil, fmt.Errorf("allocate %s: no RDMA device matches the resource's selectors", r.name)
	}
	return containerResponse(r.ports, r.cdi), nil
}

func numaOf(n int) []int64 {
	if n < 0 {
		return nil
	}
	return []int64{int64(n)}
}

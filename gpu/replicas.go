package gpu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// maxResourceDevices bounds one resource's devices, replicas included: the
// kubelet reads ListAndWatch answers with gRPC's default 4 MiB limit, and
// a device is ~70 bytes on the wire (a replica ID, health, NUMA node).
const maxResourceDevices = 16384

// ReplicaID is the device ID of replica n of the GPU or MIG device uuid,
// as NVIDIA's plugin forms it (internal/rm/devices.go NewAnnotatedID).
func ReplicaID(uuid string, n int) string {
	return uuid + ReplicaSeparator + strconv.Itoa(n)
}

// SharedUUID is the GPU or MIG UUID a device ID names: the ID itself, or a
// replica's ID without its "::<n>" (NVIDIA's AnnotatedID.GetID).
func SharedUUID(id string) string {
	uuid, _, _ := strings.Cut(id, ReplicaSeparator)
	return uuid
}

// share replaces, for every resource ts shares, the devices it chooses with
// their replicas, served under the resource's served name; the devices it
// does not choose stay where they were, unshared (NVIDIA's
// internal/rm/device_map.go updateDeviceMapWithReplicas). A resource the
// node does not have is skipped, as there. It fails when devices names
// devices the resource does not have, or when replicas would be served
// under the name of a resource of other devices.
func share(groups map[string][]device, ts *TimeSlicing) (map[string][]device, error) {
	if ts == nil || len(ts.Resources) == 0 {
		return groups, nil
	}
	out := map[string][]device{}
	// from is the resource whose devices each output resource serves.
	from := map[string]string{}
	put := func(name, source string, devs []device) error {
		if len(devs) == 0 {
			return nil
		}
		if f, ok := from[name]; ok && f != source {
			return fmt.Errorf("%s: the replicas of %s would be served as %s, a resource of %s", timeSlicingPath, source, name, f)
		}
		from[name] = source
		out[name] = append(out[name], devs...)
		if len(out[name]) > maxResourceDevices {
			return fmt.Errorf("%s: %s would have %d devices; at most %d fit the kubelet's device list (fewer replicas)", timeSlicingPath, name, len(out[name]), maxResourceDevices)
		}
		return nil
	}
	names := make([]string, 0, len(groups))
	for name := range groups {
		if _, shared := ts.Lookup(name); !shared {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		if err := put(name, name, groups[name]); err != nil {
			return nil, err
		}
	}
	for i, r := range ts.Resources {
		devs := groups[r.Name]
		if len(devs) == 0 {
			continue
		}
		chosen, err := r.Devices.choose(devs)
		if err != nil {
			return nil, fmt.Errorf("%s.resources[%d].devices: %w", timeSlicingPath, i, err)
		}
		var keep, replicas []device
		for j, d := range devs {
			if !chosen[j] {
				keep = append(keep, d)
				continue
			}
			for n := range r.Replicas {
				rd := d
				rd.id = ReplicaID(d.uuid, n)
				rd.replicas = r.Replicas
				replicas = append(replicas, rd)
			}
		}
		if err := put(r.Name, r.Name, keep); err != nil {
			return nil, err
		}
		if err := put(r.ServedName(ts.RenameByDefault), r.Name, replicas); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// choose says which of devs (in NVML order) are shared.
func (d SharedDevices) choose(devs []device) ([]bool, error) {
	chosen := make([]bool, len(devs))
	switch {
	case d.All():
		for i := range chosen {
			chosen[i] = true
		}
	case d.Count > 0:
		if d.Count > len(devs) {
			return nil, fmt.Errorf("%d devices to share, but the resource has %d", d.Count, len(devs))
		}
		for i := range d.Count {
			chosen[i] = true
		}
	default:
		for _, ref := range d.List {
			i := slices.IndexFunc(devs, func(dv device) bool { return dv.uuid == ref || dv.index == ref })
			if i < 0 {
				return nil, fmt.Errorf("%s is not a device of the resource on this node", ref)
			}
			chosen[i] = true
		}
	}
	return chosen, nil
}

// shared reports whether the resource serves replicas.
func (r *resource) shared() bool {
	return slices.ContainsFunc(r.devices, func(d device) bool { return d.replicas > 0 })
}

// Share is how the time-slicing configuration shares one device.
type Share struct {
	// Replicas is how many holders the device may have at once.
	Replicas int
	// ServedAs is the resource its replicas are served as by the device
	// plugin (SharedResource.ServedName).
	ServedAs string
}

// Shares is, by GPU or MIG UUID, the devices t shares and how: whole GPUs
// (GPUs not in MIG mode) of nvidia.com/gpu and MIG devices of
// nvidia.com/mig-<profile>, each resource's devices chosen as the device
// plugin chooses them (SharedDevices). This is the whole-GPU and
// per-profile naming the DRA driver serves; it fails, as Resources does,
// when a resource's devices names devices the node does not have. Nil
// when nothing is shared.
func (t *TimeSlicing) Shares(node *topology.Node) (map[string]Share, error) {
	if t == nil || len(t.Resources) == 0 || node == nil {
		return nil, nil
	}
	groups := map[string][]device{}
	for _, g := range node.GPUs {
		if !g.MIGEnabled {
			if g.UUID != "" {
				groups[ResourceGPU] = append(groups[ResourceGPU], device{uuid: g.UUID, index: strconv.Itoa(g.Index)})
			}
			continue
		}
		for _, m := range g.MIG {
			name, err := migResourceName(m.Profile)
			if err != nil || m.UUID == "" {
				continue
			}
			groups[name] = append(groups[name], device{uuid: m.UUID, index: fmt.Sprintf("%d:%d", g.Index, m.Index)})
		}
	}
	out := map[string]Share{}
	for i, r := range t.Resources {
		devs := groups[r.Name]
		if len(devs) == 0 {
			continue
		}
		chosen, err := r.Devices.choose(devs)
		if err != nil {
			return nil, fmt.Errorf("%s.resources[%d].devices: %w", timeSlicingPath, i, err)
		}
		for j, d := range devs {
			if chosen[j] {
				out[d.uuid] = Share{Replicas: r.Replicas, ServedAs: r.ServedName(t.RenameByDefault)}
			}
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// This file holds what the tracker reads of Dynamic Resource Allocation:
// the devices of our DRA driver that the kubelet's pod-resources List names
// in a container's dynamic resources, resolved to the device IDs the
// tracker keys everything by.

package usage

import (
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// draDevices resolves the device names this node publishes in its DRA
// pool to the IDs assignments are keyed by: a GPU's UUID, a MIG device's
// UUID, a NIC's RDMA device name (mlx5_0), the IDs the device plugin
// advertises for GPUs and MIG devices and the health monitor uses for
// all three.
//
// The names are those dra.Build publishes from the same model (and the
// kubelet plugin resolves when it prepares a claim): gpu-<index> for a GPU
// not in MIG mode, dra.MIGName for each MIG device of a GPU in MIG mode
// (and dra.PlacementName, the name it is allocated under when it was made
// on demand), dra.NICName for each NIC. A GPU whose UUID is unknown (lost before it
// was read) has no ID to resolve to.
type draDevices struct {
	pool string
	ids  map[string]string
}

// newDRADevices indexes node n's DRA devices in pool (this node's name);
// nil when pool is empty (DRA off: dynamic resources are ignored).
func newDRADevices(pool string, n *topology.Node) *draDevices {
	if pool == "" {
		return nil
	}
	d := &draDevices{pool: pool, ids: map[string]string{}}
	if n == nil {
		return d
	}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.MIGEnabled {
			if g.UUID != "" {
				d.ids[dra.GPUName(g.Index)] = g.UUID
			}
			continue
		}
		for _, m := range g.MIG {
			if m.UUID == "" {
				continue
			}
			d.ids[dra.MIGName(g.Index, m)] = m.UUID
			if len(g.MIGProfiles) > 0 && m.Placement.Size > 0 {
				// On a GPU whose MIG devices are made on demand, one
				// made for a claim is allocated under the name of its
				// placement.
				d.ids[dra.PlacementName(g.Index, m.Profile, m.Placement.Start)] = m.UUID
			}
		}
	}
	for _, nic := range n.NICs {
		d.ids[dra.NICName(nic.Name)] = nic.Name
	}
	return d
}

// draDevice is one device of ours in a container's dynamic resources.
type draDevice struct {
	// claim is the ResourceClaim, namespace/name.
	claim string
	// name is the device's name in the pool (gpu-0).
	name string
	// id is what name resolves to; empty when it does not resolve.
	id string
}

// of lists the devices of our driver in this pool that the kubelet names
// in one container's dynamic resources, in its order, each once. Other
// drivers' devices (NVIDIA's gpu.nvidia.com also names its GPUs gpu-0 in
// a pool named after the node) and other pools are left out.
//
// What the kubelet fills in (k8s.io/kubernetes v1.37.2,
// pkg/kubelet/cm/container_manager_linux.go GetDynamicResources, with
// pkg/kubelet/cm/dra/manager.go GetContainerClaimInfos and
// PrepareResources): one DynamicResource per ResourceClaim the container
// references (resources.claims, plus the claim of DRA-backed extended
// resources), once the claim is prepared, with claim_name and
// claim_namespace; one ClaimResource per device of each driver as the
// driver's NodePrepareResources answered it (driver_name, pool_name,
// device_name, cdi_devices, share_id), i.e. every device of the claim
// for that driver, whichever of the claim's requests the container
// names. The List is filled unconditionally (the
// KubeletPodResourcesDynamicResources gate is GA and locked on since
// 1.36); before the claim is prepared, or when the kubelet cannot find
// its state, the container has none.
func (d *draDevices) of(ctr *podresourcesv1.ContainerResources) []draDevice {
	if d == nil {
		return nil
	}
	var out []draDevice
	seen := map[string]bool{}
	for _, dr := range ctr.GetDynamicResources() {
		claim := dr.GetClaimNamespace() + "/" + dr.GetClaimName()
		for _, cr := range dr.GetClaimResources() {
			if cr.GetDriverName() != dra.DriverName || cr.GetPoolName() != d.pool {
				continue
			}
			name := cr.GetDeviceName()
			if seen[claim+"\x00"+name] {
				continue
			}
			seen[claim+"\x00"+name] = true
			out = append(out, draDevice{claim: claim, name: name, id: d.ids[name]})
		}
	}
	return out
}

package usage

import (
	"strings"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// DRAClaim is the ResourceClaim through which our DRA driver allocated a
// device, as the kubelet's pod-resources List names it in a container's
// dynamic resources (DynamicResource claim_name and claim_namespace,
// ClaimResource driver_name, pool_name and device_name).
type DRAClaim struct {
	Namespace, Name string
	// Driver is the DRA driver (dra.DriverName), Pool this node's pool
	// and Device the device's name in it (gpu-0).
	Driver, Pool, Device string
}

// Claim returns the DRA claim holding device id (a GPU or MIG UUID):
// ok is false when no DRA assignment names it, or when its DRA
// assignments do not all name the same claim and device (the
// containers of several pods sharing one claim name the same one).
// Device-plugin assignments of the device are not looked at.
func (a *Assignments) Claim(id string) (DRAClaim, bool) {
	if a == nil {
		return DRAClaim{}, false
	}
	var c DRAClaim
	found := false
	for _, as := range a.byBase[baseID(id)] {
		if as.Claim == "" {
			continue
		}
		ns, name, _ := strings.Cut(as.Claim, "/")
		got := DRAClaim{Namespace: ns, Name: name, Driver: as.Resource, Pool: as.Pool, Device: as.DRADevice}
		if found && got != c {
			return DRAClaim{}, false
		}
		c, found = got, true
	}
	return c, found
}

// NewDRAAssignments is NewAssignments that also counts the devices of our
// DRA driver in pool, named in each container's dynamic resources and
// resolved against node n, as the tracker does with Config.DRAPool.
func NewDRAAssignments(resp *podresourcesv1.ListPodResourcesResponse, checkpoint []CheckpointEntry, pool string, n *topology.Node) *Assignments {
	return newAssignments(resp, checkpoint, newDRADevices(pool, n), nil)
}

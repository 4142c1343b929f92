package rdma

import (
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DeviceEdits is what a container needs to use every port of the named
// RDMA devices ("mlx5_0"), outside the device plugin: the same device
// specs and environment (RDMA_DEVICES, NCCL_IB_HCA, RDMA_NETDEVS) an
// Allocate of those ports returns without CDI. The DRA plugin turns it
// into a CDI spec.
func DeviceEdits(devs []Device, names []string) ([]*pluginapi.DeviceSpec, map[string]string, error) {
	var refs []portRef
	for _, name := range names {
		var d *Device
		for i := range devs {
			if devs[i].Name == name {
				d = &devs[i]
				break
			}
		}
		if d == nil {
			return nil, nil, fmt.Errorf("rdma device %s: not on this node", name)
		}
		if len(d.Ports) == 0 {
			return nil, nil, fmt.Errorf("rdma device %s: no ports", name)
		}
		for _, p := range d.Ports {
			refs = append(refs, portRef{id: d.PortID(p.Number), dev: d, port: p})
		}
	}
	resp := containerResponse(refs, false)
	return resp.Devices, resp.Envs, nil
}

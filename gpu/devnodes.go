package gpu

import (
	"fmt"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// DeviceEdits is what a container needs to use the GPUs and MIG devices
// with the given UUIDs, outside the device plugin: the device specs
// Allocate passes with PassDeviceSpecs (the devices' own nodes, which must
// exist under hostRoot, and the control nodes present) and
// NVIDIA_VISIBLE_DEVICES listing the UUIDs. The DRA plugin turns it into a
// CDI spec, so both APIs hand a container the same nodes.
func DeviceEdits(files HostFiles, node *topology.Node, uuids []string) ([]*pluginapi.DeviceSpec, map[string]string, error) {
	caps := loadMIGCaps(files.HostRoot)
	byUUID := map[string]device{}
	for i := range node.GPUs {
		g := &node.GPUs[i]
		if g.UUID != "" {
			byUUID[g.UUID] = gpuDevice(g)
		}
		for j := range g.MIG {
			byUUID[g.MIG[j].UUID] = migDevice(g, &g.MIG[j], caps)
		}
	}
	devs := make([]*device, 0, len(uuids))
	for _, id := range uuids {
		d, ok := byUUID[id]
		if !ok {
			return nil, nil, fmt.Errorf("gpu %s: not on this node", id)
		}
		if d.lost {
			return nil, nil, fmt.Errorf("gpu %s: lost", id)
		}
		devs = append(devs, &d)
	}
	r := &resource{cfg: Config{HostRoot: files.HostRoot, HostDevPrefix: files.HostDevPrefix}}
	specs, err := r.deviceSpecs(devs)
	if err != nil {
		return nil, nil, err
	}
	return specs, map[string]string{visibleDevicesEnv: strings.Join(uuids, ",")}, nil
}

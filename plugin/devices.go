package plugin

import (
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// deviceList is one immutable snapshot of a resource's devices as the kubelet
// sees them: sorted by ID so that two snapshots compare equal whenever the
// kubelet would see no difference, whatever order Devices() returned.
type deviceList struct {
	devs []*pluginapi.Device
	byID map[string]*pluginapi.Device
}

// newDeviceList converts devices to their kubelet form. The result is never
// mutated afterwards; it is shared by every ListAndWatch stream.
func newDeviceList(devices []Device) *deviceList {
	l := &deviceList{
		devs: make([]*pluginapi.Device, 0, len(devices)),
		byID: make(map[string]*pluginapi.Device, len(devices)),
	}
	for _, d := range devices {
		if _, dup := l.byID[d.ID]; dup || d.ID == "" {
			// A Resource bug must not make the kubelet see one device twice.
			continue
		}
		pd := toPluginDevice(d)
		l.devs = append(l.devs, pd)
		l.byID[d.ID] = pd
	}
	slices.SortFunc(l.devs, func(a, b *pluginapi.Device) int { return strings.Compare(a.ID, b.ID) })
	return l
}

// toPluginDevice maps one Device to the kubelet API; Topology stays nil when
// the device has no NUMA affinity, which the kubelet reads as "any node".
func toPluginDevice(d Device) *pluginapi.Device {
	pd := &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy}
	if d.Healthy {
		pd.Health = pluginapi.Healthy
	}
	if len(d.NUMANodes) > 0 {
		pd.Topology = &pluginapi.TopologyInfo{Nodes: make([]*pluginapi.NUMANode, 0, len(d.NUMANodes))}
		for _, n := range d.NUMANodes {
			pd.Topology.Nodes = append(pd.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return pd
}

// equal reports whether the kubelet would see the same list from l and o.
func (l *deviceList) equal(o *deviceList) bool {
	if l == nil || o == nil {
		return l == o
	}
	return slices.EqualFunc(l.devs, o.devs, func(a, b *pluginapi.Device) bool {
		return a.ID == b.ID && a.Health == b.Health &&
			slices.EqualFunc(a.GetTopology().GetNodes(), b.GetTopology().GetNodes(),
				func(x, y *pluginapi.NUMANode) bool { return x.GetID() == y.GetID() })
	})
}

// healthyCount is logged with every change so an operator sees capacity move.
func (l *deviceList) healthyCount() int {
	n := 0
	for _, d := range l.devs {
		if d.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

package sim

import (
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// installNICs writes the spec's NICs as RDMA devices under the host root:
// /sys/class/infiniband/<nic> with one port (ACTIVE/LinkUp), the device
// link to the NIC's PCI function (which writeHostTree created under the
// same switch as its GPUs), its netdevs under device/net and
// /sys/class/net, infiniband_verbs/uverbsN and infiniband_mad/umadN (plus
// issmN on InfiniBand ports), and /dev/infiniband/* nodes (character
// devices when the process may mknod, else empty files) including
// rdma_cm. NICs without a PCI path are skipped, as writeHostTree does.
func (n *Node) installNICs() {
	if err := n.writeNICs(); err != nil {
		n.log.Error("simulated NICs incomplete", "err", err)
	}
}

func (n *Node) writeNICs() error {
	n.mu.RLock()
	nics := cloneNode(n.spec).NICs
	n.mu.RUnlock()
	if len(nics) == 0 {
		return nil
	}
	// Real character devices (when allowed) so a container runtime accepts
	// them as device specs in end-to-end runs.
	tree := fakesys.Tree{RDMACM: true, DeviceNodes: true}
	for i, nic := range nics {
		path := nic.PCIPath
		if len(path) == 0 && nic.PCIBusID != "" {
			path = []string{nic.PCIBusID}
		}
		if len(path) == 0 {
			continue
		}
		tree.HCAs = append(tree.HCAs, simHCA(i, nic, path))
	}
	if err := fakesys.Write(n.hostRoot, tree); err != nil {
		return fmt.Errorf("write simulated nics: %w", err)
	}
	return nil
}

// simHCA describes NIC i as a single-port ConnectX HCA: InfiniBand NICs are
// ConnectX-7 (101b... as the PCI tree writes), Ethernet ones RoCE ports
// whose netdevs also back the RoCE GIDs.
func simHCA(i int, nic topology.NIC, path []string) fakesys.HCA {
	ll := nic.LinkLayer
	if ll == "" {
		ll = "InfiniBand"
	}
	fn := nicFunction(ll)
	h := fakesys.HCA{
		Name:     nic.Name,
		PCIPath:  path,
		Vendor:   fmt.Sprintf("%04x", fn.vendor),
		DeviceID: fmt.Sprintf("%04x", fn.device),
		Driver:   "mlx5_core",
		NUMANode: nic.NUMANode,
		NodeGUID: simGUID(nic.Name),
		FWVer:    "28.39.1002",
		BoardID:  "MT_0000000838",
		UVerbs:   "uverbs" + strconv.Itoa(i),
	}
	port := fakesys.Port{Number: 1, LinkLayer: ll, Rate: "400 Gb/sec (4X NDR)", UMAD: "umad" + strconv.Itoa(i)}
	if strings.EqualFold(ll, "InfiniBand") {
		port.LinkLayer = "InfiniBand"
		port.ISSM = "issm" + strconv.Itoa(i)
	} else {
		port.LinkLayer = "Ethernet"
		port.Rate = "200 Gb/sec (4X HDR)"
		port.GIDNetDevs = nic.NetDevs
	}
	mtu := 4092 // IPoIB datagram mode
	if port.LinkLayer == "Ethernet" {
		mtu = 9000
	}
	for _, nd := range nic.NetDevs {
		h.NetDevs = append(h.NetDevs, fakesys.NetDev{Name: nd, MTU: mtu})
	}
	h.Ports = []fakesys.Port{port}
	return h
}

// simGUID derives a stable node GUID from the device name.
func simGUID(name string) string {
	s := sha256.Sum256([]byte(name))
	return fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
}

// setPortState takes the port of a simulated NIC down (state DOWN,
// phys_state Polling, netdevs operstate "down": what a pulled cable looks
// like) or back up. nic is "mlx5_0" (port 1) or "mlx5_0:<port>". The fault
// dispatcher calls it for kind "port-down" (inject: up=false, clear:
// up=true).
func (n *Node) setPortState(nic string, up bool) error {
	name, port := nic, 1
	if dev, p, ok := strings.Cut(nic, ":"); ok {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 {
			return fmt.Errorf("nic %q: bad port %q", nic, p)
		}
		name, port = dev, v
	}
	n.mu.RLock()
	var found *topology.NIC
	for i := range n.spec.NICs {
		if n.spec.NICs[i].Name == name {
			c := n.spec.NICs[i]
			found = &c
		}
	}
	n.mu.RUnlock()
	if found == nil {
		return fmt.Errorf("nic %q: no such nic", name)
	}
	if err := fakesys.SetPortState(n.hostRoot, name, port, up); err != nil {
		return fmt.Errorf("nic %s: %w", nic, err)
	}
	state := "up"
	if !up {
		state = "down"
	}
	for _, nd := range found.NetDevs {
		if err := fakesys.SetNetDevOperState(n.hostRoot, nd, state); err != nil {
			return fmt.Errorf("nic %s: %w", nic, err)
		}
	}
	return nil
}

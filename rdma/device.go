package rdma

import (
	"strconv"
	"strings"
)

// Link layers as the kernel writes them to ports/N/link_layer.
const (
	LinkLayerInfiniBand = "InfiniBand"
	LinkLayerEthernet   = "Ethernet"
)

// Device is one RDMA device (an entry of /sys/class/infiniband) with the PCI
// function behind it, its ports and its character devices.
type Device struct {
	// Name is the ibdev name, e.g. "mlx5_0".
	Name            string
	NodeGUID        string // node_guid
	FirmwareVersion string // fw_ver
	BoardID         string // board_id
	HCAType         string // hca_type
	PCI             PCIFunction
	// NetDevs are the interfaces under device/net/ (all ports).
	NetDevs []NetDev
	// Ports are ordered by port number.
	Ports []Port
	// UVerbs is /dev/infiniband/uverbsN (from infiniband_verbs/*/ibdev);
	// nil when the device has none.
	UVerbs *CharDev
	// RDMACM is the node-wide /dev/infiniband/rdma_cm, nil when absent.
	RDMACM *CharDev
}

// Port is one port of an RDMA device. Each port is one allocatable unit
// ("device ID") of an exclusive resource.
type Port struct {
	Number    uint
	State     string // ports/N/state, e.g. "ACTIVE"
	PhysState string // ports/N/phys_state, e.g. "LinkUp"
	LinkLayer string // ports/N/link_layer: "InfiniBand" or "Ethernet"
	// Rate is the port rate in bytes/second (ports/N/rate).
	Rate uint64
	// NetDevs are the interfaces backing this port: the device/net entries
	// whose dev_port matches, then any further RoCE gid_attrs/ndevs
	// interfaces (marked Virtual).
	NetDevs []NetDev
	UMAD    *CharDev // infiniband_mad/umadN for this port
	ISSM    *CharDev // infiniband_mad/issmN, InfiniBand ports only
}

// PCIFunction is the PCI function behind an RDMA device's "device" link.
type PCIFunction struct {
	// Address is the BDF, e.g. "0000:0c:00.0"; empty when the RDMA device
	// has no PCI parent (software RDMA).
	Address  string
	Vendor   string // e.g. "15b3", without 0x
	DeviceID string // e.g. "101b", without 0x
	Driver   string // base name of the driver link, e.g. "mlx5_core"
	// PhysFn is the PF's BDF when this function is an SR-IOV VF.
	PhysFn string
	// NUMANode is device/numa_node; -1 when the platform reports none.
	NUMANode int
	// Path is the chain of PCI addresses from the root port down to the
	// function itself, as in topology.GPU.PCIPath.
	Path []string
	// HostBridge is the "pciDDDD:BB" element the path hangs off.
	HostBridge string
}

// IsVF reports whether the function is an SR-IOV virtual function.
func (p PCIFunction) IsVF() bool { return p.PhysFn != "" }

// NetDev is a network interface backing an RDMA port.
type NetDev struct {
	Name string
	// OperState is the RFC 2863 state ("up", "down", "lowerlayerdown",
	// "unknown"...), from netlink when the link is in the handle's
	// namespace, else from /sys/class/net/<name>/operstate. Empty if
	// neither knows the interface.
	OperState string
	// AdminUp is IFF_UP (netlink only; true when only sysfs was read).
	AdminUp bool
	MTU     int
	// Virtual marks an interface seen only in the port's RoCE GID table (a
	// VLAN, macvlan or bond on top of it). Selectors match it, but it does
	// not decide the port's health and is not listed in RDMA_NETDEVS: an
	// unused VLAN being down says nothing about the link.
	Virtual bool
}

// CharDev is a character device handed to containers.
type CharDev struct {
	// Name is the node name, e.g. "uverbs0".
	Name string
	// Path is the path inside the container, e.g. /dev/infiniband/uverbs0.
	Path string
	// HostPath is the path the container runtime opens on the host.
	HostPath string
}

// PortID is the device ID of one port: the ibdev name for single-port
// devices (the common mlx5 case, one PCI function per port) and
// "<ibdev>:<port>" otherwise, the same syntax NCCL_IB_HCA uses.
func (d Device) PortID(port uint) string {
	if len(d.Ports) == 1 {
		return d.Name
	}
	return d.Name + ":" + strconv.FormatUint(uint64(port), 10)
}

// PortIDs lists the device IDs of every port.
func (d Device) PortIDs() []string {
	ids := make([]string, 0, len(d.Ports))
	for _, p := range d.Ports {
		ids = append(ids, d.PortID(p.Number))
	}
	return ids
}

// portUp reports whether the port itself is usable, and why not.
func (p Port) portUp() (bool, string) {
	if !strings.EqualFold(p.State, "ACTIVE") {
		return false, "port " + strconv.FormatUint(uint64(p.Number), 10) + " state is " + orUnknown(p.State)
	}
	if !strings.EqualFold(p.PhysState, "LinkUp") {
		return false, "port " + strconv.FormatUint(uint64(p.Number), 10) + " phys_state is " + orUnknown(p.PhysState)
	}
	return true, ""
}

// up reports whether the netdev can carry traffic. "unknown" counts as up
// when the interface is admin-up: virtual and some IPoIB drivers never
// report an operstate.
func (n NetDev) up() bool {
	switch n.OperState {
	case "up", "":
		return true
	case "unknown":
		return n.AdminUp
	default:
		return false
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

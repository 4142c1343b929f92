package sim

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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
	port := fakesys.Port{Number: 1, LinkLayer: ll, Rate: "400 Gb/sec (4X NDR)", UMAD: "umad" + strconv.Itoa(i),
		Counters: map[string]uint64{}}
	for _, c := range fakesys.PortCounterNames {
		port.Counters[c] = 0
	}
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
	name, port, found, err := n.nicPort(nic)
	if err != nil {
		return err
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

// nicPort splits nic ("mlx5_0" for port 1, or "mlx5_0:<port>") and finds
// the NIC in the spec.
func (n *Node) nicPort(nic string) (name string, port int, found topology.NIC, err error) {
	name, port = nic, 1
	if dev, p, ok := strings.Cut(nic, ":"); ok {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 {
			return "", 0, found, fmt.Errorf("nic %q: bad port %q", nic, p)
		}
		name, port = dev, v
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for i := range n.spec.NICs {
		if n.spec.NICs[i].Name == name {
			return name, port, n.spec.NICs[i], nil
		}
	}
	return "", 0, found, fmt.Errorf("nic %q: no such nic", name)
}

// nicFaults are the running nic-flap and nic-errors faults, by kind and
// NIC; each is a goroutine that changes the simulated sysfs every period.
type nicFaults struct {
	mu      sync.Mutex
	running map[string]*nicFaultRun
	// counterMu serialises the counters' read-modify-write.
	counterMu sync.Mutex
}

type nicFaultRun struct {
	stop, done chan struct{}
}

// startNICFault starts f (nic-flap or nic-errors) on its NIC, replacing
// the same kind already running there. It acts once at once, then every
// Period: nic-flap takes the port down (state, phys_state and netdevs, as
// port-down does) with link_downed +1 for half the period and brings it
// up again; nic-errors adds Count to symbol_error and port_rcv_errors.
func (n *Node) startNICFault(f Fault) error {
	name, port, _, err := n.nicPort(f.NIC)
	if err != nil {
		return err
	}
	period := time.Second
	if f.Period != "" {
		if period, err = time.ParseDuration(f.Period); err != nil || period <= 0 {
			return fmt.Errorf("period: %q is not a positive duration such as 500ms", f.Period)
		}
	}
	count := uint64(100)
	switch {
	case f.Count < 0:
		return fmt.Errorf("count: %d is negative", f.Count)
	case f.Count > 0:
		count = uint64(f.Count)
	}
	addCounter := func(c string, d uint64) error {
		n.nicFaults.counterMu.Lock()
		defer n.nicFaults.counterMu.Unlock()
		_, err := fakesys.AddPortCounter(n.hostRoot, name, port, c, d)
		return err
	}
	// act is the change at the start of a period (for nic-flap the link
	// going down); settle, for nic-flap, brings the link up after half the
	// period, or at once when stop is closed. An error ends the fault (the
	// simulated root removed).
	act := func() error {
		if f.Kind == FaultNICErrors {
			return errors.Join(addCounter("symbol_error", count), addCounter("port_rcv_errors", count))
		}
		if err := addCounter("link_downed", 1); err != nil {
			return err
		}
		return n.setPortState(f.NIC, false)
	}
	settle := func(stop <-chan struct{}) error {
		if f.Kind != FaultNICFlap {
			return nil
		}
		select {
		case <-stop:
		case <-time.After(period / 2):
		}
		return n.setPortState(f.NIC, true)
	}
	// The same fault already running on the NIC ends first (a flapping
	// port comes up), so the two never interleave.
	if err := n.stopNICFault(f); err != nil {
		return err
	}
	if err := act(); err != nil {
		return fmt.Errorf("nic %s: %w", f.NIC, err)
	}
	run := &nicFaultRun{stop: make(chan struct{}), done: make(chan struct{})}
	n.nicFaults.mu.Lock()
	if n.nicFaults.running == nil {
		n.nicFaults.running = map[string]*nicFaultRun{}
	}
	n.nicFaults.running[f.Kind+"/"+f.NIC] = run
	n.nicFaults.mu.Unlock()
	go func() {
		defer close(run.done)
		t := time.NewTicker(period)
		defer t.Stop()
		err := settle(run.stop)
		for err == nil {
			select {
			case <-run.stop:
				return
			case <-t.C:
				if err = act(); err == nil {
					err = settle(run.stop)
				}
			}
		}
		n.log.Warn("simulated NIC fault ended", "kind", f.Kind, "nic", f.NIC, "err", err)
	}()
	n.log.Info("simulated fault injected", "kind", f.Kind, "nic", f.NIC, "period", period)
	return nil
}

// stopNICFault ends f's kind on its NIC; a flapping port is left up. The
// counters keep their values, as a real port's do.
func (n *Node) stopNICFault(f Fault) error {
	if _, _, _, err := n.nicPort(f.NIC); err != nil {
		return err
	}
	n.nicFaults.mu.Lock()
	run := n.nicFaults.running[f.Kind+"/"+f.NIC]
	delete(n.nicFaults.running, f.Kind+"/"+f.NIC)
	n.nicFaults.mu.Unlock()
	run.end()
	return nil
}

// end stops the run and waits for it; nil does nothing.
func (r *nicFaultRun) end() {
	if r == nil {
		return
	}
	close(r.stop)
	<-r.done
}

package rdma

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/vishvananda/netns"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// NICsOptions says where OpenNICs finds the node's RDMA devices.
type NICsOptions struct {
	// Root is the host root that sys/ and dev/ hang off.
	Root string
	// Simulated says Root is a simulated node's: the /dev/infiniband paths
	// handed to containers are under Root, and there is no netlink.
	Simulated bool
	Logger    *slog.Logger
}

// NICs are the node's RDMA devices, discovered once at start, with the
// configured resources over them. A host without RDMA simply has none,
// which is not an error.
type NICs struct {
	cfg   Config
	root  string
	devs  []Device
	err   error // discovery failure, reported by Resources
	links Links
	close func()
}

// OpenNICs discovers the RDMA devices under opts.Root. On a real node
// netlink gives netdev state and link events (its failure only loses
// those); a discovery failure is logged and returned by Resources, so it
// drops only the rdma resources.
func OpenNICs(cfg Config, opts NICsOptions) *NICs {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &NICs{cfg: cfg, root: opts.Root, close: func() {}}
	dopts := DiscoverOptions{Root: opts.Root, AllowExclusiveNetns: cfg.AllowExclusiveNetns, Logger: log}
	if opts.Simulated {
		dopts.HostDevPrefix = opts.Root
	} else if nl, err := NewNetlink(netns.None()); err != nil {
		log.Warn("netlink unavailable: RDMA netdev state is read from sysfs only", "err", err)
	} else {
		dopts.Links, n.links, n.close = nl, nl, nl.Close
	}
	n.devs, n.err = Discover(context.Background(), dopts)
	if n.err != nil {
		n.err = fmt.Errorf("rdma discovery: %w", n.err)
		log.Error("RDMA devices not served", "err", n.err)
	}
	return n
}

// Devices are the discovered devices (nil if discovery failed).
func (n *NICs) Devices() []Device { return n.devs }

// Err is why discovery failed, nil when it did not.
func (n *NICs) Err() error { return n.err }

// Close releases the netlink handle.
func (n *NICs) Close() { n.close() }

// AddToNode puts the NICs and their PCIe distance to each GPU into the
// node model (snapshot, topology dump, labels).
func (n *NICs) AddToNode(node *topology.Node) {
	if node != nil && len(n.devs) > 0 {
		node.NICs = ToTopology(n.devs, node.GPUs)
	}
}

// Served says whether any rdma resource is configured.
func (n *NICs) Served() bool { return len(n.cfg.Resources) > 0 }

// Resources builds the configured rdma resources, preferring the NICs next
// to the GPUs recently allocated on node (nil when GPU discovery failed).
// It returns the discovery error if discovery failed.
func (n *NICs) Resources(node *topology.Node, health HealthView, cdi bool, recent RecentGPUs) ([]plugin.Resource, error) {
	if n.err != nil {
		return nil, n.err
	}
	var gpus []topology.GPU
	if node != nil {
		gpus = node.GPUs
	}
	return Resources(n.devs, n.cfg.Resources, health, cdi, WithGPUAffinity(gpus, recent))
}

// Watcher watches every served port's state and tells observe. nil when no
// rdma resource is configured or there is no device: unserved ports must
// not make the node unfit.
func (n *NICs) Watcher(observe ObserveFunc, log *slog.Logger) (*Watcher, error) {
	if !n.Served() || len(n.devs) == 0 {
		return nil, nil
	}
	w, err := NewWatcher(WatcherOptions{
		Root:     n.root,
		Devices:  n.devs,
		Links:    n.links,
		Interval: time.Duration(n.cfg.PollInterval),
		Logger:   log,
		Observe:  observe,
	})
	if err != nil {
		return nil, fmt.Errorf("rdma watcher: %w", err)
	}
	return w, nil
}

// PortCounters reads and judges the error counters of the ports Watcher
// watches, telling observe. nil when the watcher has nothing to watch or
// rdma.portCounters.disabled is set.
func (n *NICs) PortCounters(observe CounterObserveFunc, hostname string, log *slog.Logger) (*PortCounters, error) {
	if !n.Served() || len(n.devs) == 0 || n.cfg.PortCounters.Disabled {
		return nil, nil
	}
	c, err := NewPortCounters(PortCountersOptions{
		Root:     n.root,
		Devices:  n.devs,
		Config:   n.cfg.PortCounters,
		Observe:  observe,
		Hostname: hostname,
		Logger:   log,
	})
	if err != nil {
		return nil, fmt.Errorf("rdma port counters: %w", err)
	}
	return c, nil
}

// WriteCDISpec writes the CDI spec of the served devices under the host
// root's var/run/cdi, where the runtime reads it (for devices passed by
// CDI name). It writes nothing without served devices.
func (n *NICs) WriteCDISpec() error {
	if !n.Served() || len(n.devs) == 0 {
		return nil
	}
	if err := WriteCDISpec(filepath.Join(n.root, "var/run/cdi"), n.devs); err != nil {
		return fmt.Errorf("rdma cdi spec: %w", err)
	}
	return nil
}

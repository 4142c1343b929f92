package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/vishvananda/netns"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// nics are the node's RDMA devices, discovered once at start: a host
// without RDMA simply has none, which is not an error.
type nics struct {
	cfg   rdma.Config
	root  string
	devs  []rdma.Device
	err   error // discovery failure, reported by the rdma source
	links rdma.Links
	close func()
}

// openNICs discovers the RDMA devices under the hardware's host root. On a
// simulated node the /dev/infiniband paths handed to containers are under
// the simulator's root and there is no netlink; on a real one netlink
// gives netdev state and link events (its failure only loses those).
func openNICs(cfg rdma.Config, hw *hardware, log *slog.Logger) *nics {
	n := &nics{cfg: cfg, root: hw.hostRoot, close: func() {}}
	opts := rdma.DiscoverOptions{Root: hw.hostRoot, AllowExclusiveNetns: cfg.AllowExclusiveNetns, Logger: log}
	if hw.sim != nil {
		opts.HostDevPrefix = hw.hostRoot
	} else if nl, err := rdma.NewNetlink(netns.None()); err != nil {
		log.Warn("netlink unavailable: RDMA netdev state is read from sysfs only", "err", err)
	} else {
		opts.Links, n.links, n.close = nl, nl, nl.Close
	}
	n.devs, n.err = rdma.Discover(context.Background(), opts)
	if n.err != nil {
		n.err = fmt.Errorf("rdma discovery: %w", n.err)
		log.Error("RDMA devices not served", "err", n.err)
	}
	return n
}

// addToNode puts the NICs and their PCIe distance to each GPU into the
// node model (snapshot, topology dump, labels).
func (n *nics) addToNode(node *topology.Node) {
	if node != nil && len(n.devs) > 0 {
		node.NICs = rdma.ToTopology(n.devs, node.GPUs)
	}
}

// source is the reconciler source of the rdma/* resources; nil without
// configured resources.
func (n *nics) source(health rdma.HealthView, cdi bool, recent rdma.RecentGPUs) *source {
	if len(n.cfg.Resources) == 0 {
		return nil
	}
	return &source{
		name: "rdma",
		build: func(node *topology.Node) ([]plugin.Resource, error) {
			if n.err != nil {
				return nil, n.err
			}
			var gpus []topology.GPU
			if node != nil {
				gpus = node.GPUs
			}
			return rdma.Resources(n.devs, n.cfg.Resources, health, cdi, rdma.WithGPUAffinity(gpus, recent))
		},
	}
}

// watcher reports every served port's state to the health monitor, so a
// port going down makes its device unhealthy in ListAndWatch. nil when no
// rdma resource is configured: unserved ports must not make the node unfit.
func (n *nics) watcher(mon *health.Monitor, log *slog.Logger) (*rdma.Watcher, error) {
	if len(n.cfg.Resources) == 0 || len(n.devs) == 0 {
		return nil, nil
	}
	w, err := rdma.NewWatcher(rdma.WatcherOptions{
		Root:     n.root,
		Devices:  n.devs,
		Links:    n.links,
		Interval: timeDuration(n.cfg.PollInterval),
		Logger:   log,
		Observe: func(id string, ok bool, reason string) {
			mon.Observe(health.Observation{DeviceID: id, Kind: health.KindNIC, Check: "rdma-port", Fatal: !ok, Cleared: ok, Reason: reason})
		},
	})
	if err != nil {
		return nil, fmt.Errorf("rdma watcher: %w", err)
	}
	return w, nil
}

// writeCDISpec writes the RDMA CDI spec where the runtime reads it, when
// devices are passed by CDI name.
func (n *nics) writeCDISpec(deviceListStrategy string) error {
	if deviceListStrategy != gpu.DeviceListCDICRI || len(n.cfg.Resources) == 0 || len(n.devs) == 0 {
		return nil
	}
	if err := rdma.WriteCDISpec(filepath.Join(n.root, "var/run/cdi"), n.devs); err != nil {
		return fmt.Errorf("rdma cdi spec: %w", err)
	}
	return nil
}

func timeDuration(d rdma.Duration) time.Duration { return time.Duration(d) }

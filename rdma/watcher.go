package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs/sysfs"

	"github.com/gpu-node-agent/gpu-node-agent/internal/sysfsattr"
)

// ObserveFunc receives port health: id is a port ID (Device.PortID),
// reason says why an unhealthy port is unhealthy.
type ObserveFunc func(id string, healthy bool, reason string)

// WatcherOptions configures a Watcher.
type WatcherOptions struct {
	// Root is the host root, as in DiscoverOptions.
	Root string
	// Devices are the devices to watch (from Discover).
	Devices []Device
	// Links, when set, provides netdev state and link events.
	Links Links
	// Interval is the sysfs poll period; 0 means DefaultPollInterval.
	Interval time.Duration
	// Observe is called once per port at start and on every change.
	Observe ObserveFunc
	Logger  *slog.Logger
}

// Watcher tracks the health of every port: a port is healthy while its
// state is ACTIVE, its phys_state LinkUp and each of its netdevs up.
// sysfs has no change notification for port attributes, so they are
// polled; netlink link events trigger an immediate re-check.
type Watcher struct {
	opts  WatcherOptions
	log   *slog.Logger
	sfs   sysfs.FS
	last  map[string]portHealth
	ports []watchedPort
}

type watchedPort struct {
	id      string
	dir     string // /sys/class/infiniband/<dev>/ports/<n>
	netdevs []string
}

type portHealth struct {
	healthy bool
	reason  string
}

// NewWatcher checks the options and opens the sysfs root.
func NewWatcher(opts WatcherOptions) (*Watcher, error) {
	if opts.Observe == nil {
		return nil, errors.New("rdma watcher: Observe is nil")
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultPollInterval
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sysRoot := filepath.Join(opts.Root, "sys")
	w := &Watcher{opts: opts, log: log, last: map[string]portHealth{}}
	if len(opts.Devices) == 0 {
		return w, nil
	}
	sfs, err := sysfs.NewFS(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("rdma watcher: open sysfs %s: %w", sysRoot, err)
	}
	w.sfs = sfs
	for _, d := range opts.Devices {
		for _, p := range d.Ports {
			w.ports = append(w.ports, watchedPort{
				id:      d.PortID(p.Number),
				dir:     filepath.Join(sysRoot, "class", "infiniband", d.Name, "ports", strconv.FormatUint(uint64(p.Number), 10)),
				netdevs: portNetDevNames(d, p, false),
			})
		}
	}
	return w, nil
}

// Run reports the health of every port until ctx is done. Without
// devices it returns at once. A failing netlink subscription is logged and
// the watcher keeps polling.
func (w *Watcher) Run(ctx context.Context) error {
	if len(w.ports) == 0 {
		return nil
	}
	events := make(chan LinkInfo, 64)
	if w.opts.Links != nil {
		err := w.opts.Links.Subscribe(ctx, events, func(err error) {
			w.log.Warn("netlink link subscription error", "err", err)
		})
		if err != nil {
			w.log.Warn("no netlink link events, polling only", "err", err)
		}
	}
	w.check(nil)
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.check(nil)
		case ev := <-events:
			w.check(&ev)
		}
	}
}

// check re-evaluates the ports (only those behind ev's interface when ev
// is set) and reports changes.
func (w *Watcher) check(ev *LinkInfo) {
	for _, p := range w.ports {
		if ev != nil && !containsString(p.netdevs, ev.Name) {
			continue
		}
		h := w.evaluate(p, ev)
		if old, ok := w.last[p.id]; ok && old == h {
			continue
		}
		w.last[p.id] = h
		w.opts.Observe(p.id, h.healthy, h.reason)
	}
}

func (w *Watcher) evaluate(p watchedPort, ev *LinkInfo) portHealth {
	state, err1 := readPortState(filepath.Join(p.dir, "state"))
	phys, err2 := readPortState(filepath.Join(p.dir, "phys_state"))
	if err := errors.Join(err1, err2); err != nil {
		return portHealth{false, fmt.Sprintf("cannot read port state: %v", err)}
	}
	if ok, why := (Port{Number: portNumber(p.dir), State: state, PhysState: phys}).portUp(); !ok {
		return portHealth{false, why}
	}
	stater := netDevStater{sfs: w.sfs, links: w.opts.Links}
	for _, name := range p.netdevs {
		nd := stater.state(name)
		if ev != nil && ev.Name == name {
			// The event carries the state it announces; a fresh query
			// could race with the next change.
			nd = NetDev{Name: name, OperState: ev.OperState, AdminUp: ev.AdminUp, MTU: ev.MTU}
		}
		if !nd.up() {
			if !nd.AdminUp && nd.OperState != "" {
				return portHealth{false, fmt.Sprintf("netdev %s is administratively down (operstate %s)", name, nd.OperState)}
			}
			return portHealth{false, fmt.Sprintf("netdev %s operstate is %s", name, nd.OperState)}
		}
	}
	return portHealth{true, ""}
}

// readPortState reads a "4: ACTIVE" style attribute and returns the name.
// Reading two small files beats procfs's full device parse (every counter
// of every port) on each poll.
func readPortState(path string) (string, error) {
	s, err := sysfsattr.Read(path)
	if err != nil {
		return "", err
	}
	if _, name, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(name), nil
	}
	return s, nil
}

func portNumber(dir string) uint {
	n, _ := strconv.ParseUint(filepath.Base(dir), 10, 32)
	return uint(n)
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

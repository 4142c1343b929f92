package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs/sysfs"
	"k8s.io/utils/clock"
)

// CheckPortCounters is the health check name of the port counter
// observations; CauseFlap is the cause key of a flapping link (the error
// rate causes are named by counterSpec.cause).
const (
	CheckPortCounters = "rdma-counters"
	CauseFlap         = "flap"
)

// counterSpec is one error counter of ports/N/counters. The meanings are
// the kernel's (Documentation/ABI/stable/sysfs-class-infiniband, from the
// IBTA PortCounters attribute); procfs's sysfs.InfiniBandCounters parses
// them, as node_exporter's infiniband collector reads them.
//
// FEC is not among them: mlx5's ports/N/hw_counters are queue, congestion
// and RoCE transport counters (drivers/infiniband/hw/mlx5/counters.c);
// corrected and uncorrected FEC blocks are only in the Ethernet netdev's
// ethtool statistics (mlx5e's rx_corrected_bits_phy and friends) and, for
// InfiniBand ports, in the PPCNT register mlxlink reads.
type counterSpec struct {
	file   string // counters/<file>
	metric string // the series name
	// cause is the health cause key of a rate over its threshold; empty for
	// link_downed, which counts as a flap instead.
	cause string
	help  string
	get   func(*sysfs.InfiniBandCounters) *uint64
}

var portCounterSpecs = []counterSpec{
	{"symbol_error", "gpu_node_agent_rdma_port_symbol_errors_total", "symbol-errors",
		"Minor link errors detected on one or more physical lanes of the port (counters/symbol_error).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.SymbolError }},
	{"link_downed", "gpu_node_agent_rdma_port_link_downed_total", "",
		"Times the port training state machine failed the link error recovery process and downed the link (counters/link_downed).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.LinkDowned }},
	{"link_error_recovery", "gpu_node_agent_rdma_port_link_error_recoveries_total", "link-error-recovery",
		"Times the port training state machine completed the link error recovery process (counters/link_error_recovery).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.LinkErrorRecovery }},
	{"port_rcv_errors", "gpu_node_agent_rdma_port_receive_errors_total", "receive-errors",
		"Packets with an error received on the port (counters/port_rcv_errors).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.PortRcvErrors }},
	{"excessive_buffer_overrun_errors", "gpu_node_agent_rdma_port_excessive_buffer_overrun_errors_total", "buffer-overruns",
		"Times consecutive flow-control update periods each had at least one buffer overrun (counters/excessive_buffer_overrun_errors).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.ExcessiveBufferOverrunErrors }},
	{"local_link_integrity_errors", "gpu_node_agent_rdma_port_local_link_integrity_errors_total", "link-integrity-errors",
		"Times the count of local physical errors exceeded the LocalPhyErrors threshold (counters/local_link_integrity_errors).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.LocalLinkIntegrityErrors }},
	{"port_xmit_discards", "gpu_node_agent_rdma_port_transmit_discards_total", "transmit-discards",
		"Outbound packets the port discarded because it was down or congested (counters/port_xmit_discards).",
		func(c *sysfs.InfiniBandCounters) *uint64 { return c.PortXmitDiscards }},
}

// linkDownedIdx is link_downed's index in portCounterSpecs.
const linkDownedIdx = 1

// CounterObserveFunc receives a port counter verdict: id is the port ID
// (Device.PortID), cause CauseFlap or a counter's cause key, bad whether
// that cause now makes the port unhealthy (false: it cleared), reason why.
type CounterObserveFunc func(id, cause string, bad bool, reason string)

// PortCountersOptions configures PortCounters.
type PortCountersOptions struct {
	// Root is the host root, as in DiscoverOptions.
	Root string
	// Devices are the devices whose ports are read (from Discover).
	Devices []Device
	Config  PortCountersConfig
	// Observe is called once per port and cause at the first read (cleared)
	// and on every change.
	Observe CounterObserveFunc
	// Hostname is the Hostname label of the metrics.
	Hostname string
	// Clock defaults to the real clock.
	Clock  clock.WithTicker
	Logger *slog.Logger
}

// PortCounters reads the error counters of every port, exports them as
// Prometheus counters and judges them: a port whose link keeps going down
// (FlapThreshold downs within FlapWindow) or whose error counters rise
// faster than their thresholds is unhealthy until it has stayed quiet for
// RecoveryPeriod. It is a prometheus.Collector of the last values read.
type PortCounters struct {
	cfg     PortCountersConfig // with defaults
	observe CounterObserveFunc
	clk     clock.WithTicker
	log     *slog.Logger
	sfs     sysfs.FS
	devs    []string
	descs   []*prometheus.Desc
	flapsD  *prometheus.Desc

	mu    sync.Mutex
	ports []*counterPort
	byID  map[string]*counterPort
	first bool // no poll yet
}

// counterPort is one port's readings and verdicts.
type counterPort struct {
	id, dev string
	port    uint
	val     []uint64 // last value per spec
	have    []bool   // whether the last read had the counter
	// hist are the increments of each poll within the longer window.
	hist []counterSample
	// downs are the down transitions the port watcher reported.
	downs []time.Time
	up    *bool // last state the port watcher reported
	// active and lastBad per cause key; since is when evidence counts
	// from (the last clear of the flap cause).
	active  map[string]bool
	lastBad map[string]time.Time
	since   time.Time
}

type counterSample struct {
	at  time.Time
	inc []uint64
}

// NewPortCounters checks the options and opens the sysfs root.
func NewPortCounters(opts PortCountersOptions) (*PortCounters, error) {
	if opts.Observe == nil {
		return nil, errors.New("rdma port counters: Observe is nil")
	}
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("rdma port counters: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	sysRoot := filepath.Join(opts.Root, "sys")
	sfs, err := sysfs.NewFS(sysRoot)
	if err != nil {
		return nil, fmt.Errorf("rdma port counters: open sysfs %s: %w", sysRoot, err)
	}
	c := &PortCounters{cfg: opts.Config.WithDefaults(), observe: opts.Observe, clk: clk, log: log, sfs: sfs,
		byID: map[string]*counterPort{}, first: true}
	labels := []string{"device", "port"}
	constLabels := prometheus.Labels{"Hostname": opts.Hostname}
	for _, s := range portCounterSpecs {
		c.descs = append(c.descs, prometheus.NewDesc(s.metric, s.help, labels, constLabels))
	}
	c.flapsD = prometheus.NewDesc("gpu_node_agent_rdma_port_flaps",
		"Link downs of the port within rdma.portCounters.flapWindow: link_downed increments or down transitions of the port state, whichever is more.",
		labels, constLabels)
	for _, d := range opts.Devices {
		c.devs = append(c.devs, d.Name)
		for _, p := range d.Ports {
			cp := &counterPort{id: d.PortID(p.Number), dev: d.Name, port: p.Number,
				val: make([]uint64, len(portCounterSpecs)), have: make([]bool, len(portCounterSpecs)),
				active: map[string]bool{}, lastBad: map[string]time.Time{}}
			c.ports = append(c.ports, cp)
			c.byID[cp.id] = cp
		}
	}
	return c, nil
}

// Run reads the counters every Interval until ctx is done.
func (c *PortCounters) Run(ctx context.Context) error {
	if len(c.ports) == 0 {
		return nil
	}
	c.poll()
	t := c.clk.NewTicker(time.Duration(c.cfg.Interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			c.poll()
		}
	}
}

// NoteState tells the check the port watcher's verdict on port id: each
// change from up to down counts as a link down of the flap check. The
// first report only sets the starting state.
func (c *PortCounters) NoteState(id string, up bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.byID[id]
	if p == nil {
		return
	}
	if p.up != nil && *p.up && !up {
		p.downs = append(p.downs, c.clk.Now())
	}
	p.up = &up
}

type counterVerdict struct {
	id, cause string
	bad       bool
	reason    string
}

// poll reads every device's counters once (procfs parses the whole
// device, ports and counters, per read), updates the verdicts and reports
// the changes.
func (c *PortCounters) poll() {
	now := c.clk.Now()
	read := map[string]*sysfs.InfiniBandDevice{}
	for _, name := range c.devs {
		ib, err := c.sfs.InfiniBandDevice(name)
		if err != nil {
			// The device stays judged on what was read before; a port
			// that is gone is the port watcher's finding.
			c.log.Debug("cannot read RDMA port counters", "device", name, "err", err)
			continue
		}
		read[name] = ib
	}
	c.mu.Lock()
	var out []counterVerdict
	first := c.first
	c.first = false
	for _, p := range c.ports {
		if ib := read[p.dev]; ib != nil {
			if ibp, ok := ib.Ports[p.port]; ok {
				c.update(p, &ibp.Counters, now)
			}
		}
		out = append(out, c.judge(p, now, first)...)
	}
	c.mu.Unlock()
	for _, v := range out {
		c.observe(v.id, v.cause, v.bad, v.reason)
	}
}

// update records one reading. A counter lower than its last value was
// reset (a driver reload, a PMA clear): the new value is its increase
// since, as Prometheus's rate() reads a counter reset, so a reset is
// never a negative or huge jump. A first reading is the baseline.
func (c *PortCounters) update(p *counterPort, ctrs *sysfs.InfiniBandCounters, now time.Time) {
	inc := make([]uint64, len(portCounterSpecs))
	for i, s := range portCounterSpecs {
		v := s.get(ctrs)
		if v == nil {
			p.have[i] = false
			continue
		}
		switch {
		case !p.have[i]:
		case *v >= p.val[i]:
			inc[i] = *v - p.val[i]
		default:
			c.log.Info("RDMA port counter reset", "port", p.id, "counter", s.file, "was", p.val[i], "now", *v)
			inc[i] = *v
		}
		p.val[i], p.have[i] = *v, true
	}
	p.hist = append(p.hist, counterSample{at: now, inc: inc})
	keep := max(time.Duration(c.cfg.RateWindow), time.Duration(c.cfg.FlapWindow))
	for len(p.hist) > 0 && !p.hist[0].at.After(now.Add(-keep)) {
		p.hist = p.hist[1:]
	}
	for len(p.downs) > 0 && !p.downs[0].After(now.Add(-time.Duration(c.cfg.FlapWindow))) {
		p.downs = p.downs[1:]
	}
}

// flaps counts p's link downs within the flap window since p.since, and
// returns the time of the latest.
func (c *PortCounters) flaps(p *counterPort, now time.Time) (n int, downed uint64, states int, last time.Time) {
	from := now.Add(-time.Duration(c.cfg.FlapWindow))
	if p.since.After(from) {
		from = p.since
	}
	for _, s := range p.hist {
		if s.at.After(from) && s.inc[linkDownedIdx] > 0 {
			downed += s.inc[linkDownedIdx]
			last = s.at
		}
	}
	for _, t := range p.downs {
		if t.After(from) {
			states++
			if t.After(last) {
				last = t
			}
		}
	}
	n = states
	if downed > uint64(n) {
		n = int(min(downed, 1<<30))
	}
	return n, downed, states, last
}

// judge updates p's causes at now and returns their changes (every cause,
// cleared, on the first poll, so that a cause persisted by the health
// monitor before a restart does not outlive the condition).
func (c *PortCounters) judge(p *counterPort, now time.Time, first bool) []counterVerdict {
	var out []counterVerdict
	recovery := time.Duration(c.cfg.RecoveryPeriod)
	set := func(cause string, bad bool, reason string) {
		if p.active[cause] != bad || first {
			out = append(out, counterVerdict{p.id, cause, bad, reason})
		}
		p.active[cause] = bad
	}

	// A flapping port stays unhealthy until no link down came for the
	// recovery period; downs before the last clear do not count again.
	n, downed, states, last := c.flaps(p, now)
	switch {
	case p.active[CauseFlap]:
		if last.After(p.lastBad[CauseFlap]) {
			p.lastBad[CauseFlap] = last
		}
		if now.Sub(p.lastBad[CauseFlap]) >= recovery {
			p.since = now
			set(CauseFlap, false, fmt.Sprintf("no link down for %s", recovery))
		}
	case n >= c.cfg.FlapThreshold:
		p.lastBad[CauseFlap] = last
		set(CauseFlap, true, fmt.Sprintf("link flapping: %d link downs within %s (link_downed +%d, state changes %d)",
			n, time.Duration(c.cfg.FlapWindow), downed, states))
	default:
		set(CauseFlap, false, "")
	}

	window := time.Duration(c.cfg.RateWindow)
	from := now.Add(-window)
	for i, s := range portCounterSpecs {
		if s.cause == "" {
			continue
		}
		limit := c.cfg.ErrorRateThresholds[s.file]
		var sum uint64
		for _, h := range p.hist {
			if h.at.After(from) {
				sum += h.inc[i]
			}
		}
		rate := float64(sum) / window.Minutes()
		switch {
		case limit > 0 && rate > limit:
			p.lastBad[s.cause] = now
			set(s.cause, true, fmt.Sprintf("%s rising at %.1f/min over %s (threshold %s/min)", s.file, rate, window, strconv.FormatFloat(limit, 'g', -1, 64)))
		case p.active[s.cause] && now.Sub(p.lastBad[s.cause]) >= recovery:
			set(s.cause, false, fmt.Sprintf("%s at or under its threshold for %s", s.file, recovery))
		case !p.active[s.cause]:
			set(s.cause, false, "")
		}
	}
	return out
}

// Describe implements prometheus.Collector.
func (c *PortCounters) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	ch <- c.flapsD
}

// Collect implements prometheus.Collector: the values last read, as
// counters of the kernel's own (a reset shows as the counter dropping,
// which rate() reads as a reset, never a negative rate), and the flap
// count.
func (c *PortCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	for _, p := range c.ports {
		port := strconv.FormatUint(uint64(p.port), 10)
		for i, d := range c.descs {
			if p.have[i] {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(p.val[i]), p.dev, port)
			}
		}
		n, _, _, _ := c.flaps(p, now)
		ch <- prometheus.MustNewConstMetric(c.flapsD, prometheus.GaugeValue, float64(n), p.dev, port)
	}
}

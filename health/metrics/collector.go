package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Defaults for Config's zero values.
const (
	DefaultInterval      = 10 * time.Second
	DefaultDeviceTimeout = 5 * time.Second
)

// Config configures a Collector.
type Config struct {
	// Interval between collections; DefaultInterval when zero.
	Interval time.Duration
	// DeviceTimeout bounds how long one cycle waits for one GPU (and its
	// MIG devices); DefaultDeviceTimeout when zero, never more than
	// Interval. A GPU still busy from an earlier cycle is skipped.
	DeviceTimeout time.Duration
	// Hostname is the Hostname label (the node name in Kubernetes).
	Hostname string
	// PodResourcesSocket is the kubelet pod-resources socket used for
	// pod/namespace/container labels; empty disables attribution. See
	// PodResourcesSocketPath.
	PodResourcesSocket string
	// XIDs feeds DCGM_FI_DEV_XID_ERRORS; nil omits that metric.
	XIDs XIDSource
}

// Collector gathers GPU readings from NVML on its own interval into an
// immutable cached snapshot and serves that snapshot as dcgm-exporter
// compatible metrics. Collect never calls NVML, so a scrape costs the same
// however slow the hardware is.
type Collector struct {
	lib   nvml.Interface
	cfg   Config
	log   *slog.Logger
	descs [numFields]*prometheus.Desc

	node     atomic.Pointer[topology.Node]
	snapshot atomic.Pointer[[]prometheus.Metric]
	kick     chan struct{}
	pods     *podAttributor

	// busy marks GPUs whose read from an earlier cycle has not returned;
	// only the collecting goroutine touches the map, the flags are shared
	// with the readers.
	busy map[string]*atomic.Bool
	// failing remembers which GPUs failed last cycle so a failure and a
	// recovery are logged once each.
	failing map[string]bool
	collect sync.Mutex

	duration prometheus.Histogram
	errors   *prometheus.CounterVec
}

// NewCollector returns a Collector reading lib and registers it, with its
// own gpu_node_agent_collection_* metrics, on reg. lib must already be
// initialised. Call SetNode before Run: the node's GPUs and MIG devices
// are what gets read.
func NewCollector(lib nvml.Interface, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Collector, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.DeviceTimeout <= 0 {
		cfg.DeviceTimeout = DefaultDeviceTimeout
	}
	cfg.DeviceTimeout = min(cfg.DeviceTimeout, cfg.Interval)
	c := &Collector{
		lib:     lib,
		cfg:     cfg,
		log:     log,
		descs:   newFieldDescs(),
		kick:    make(chan struct{}, 1),
		busy:    map[string]*atomic.Bool{},
		failing: map[string]bool{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpu_node_agent_collection_duration_seconds",
			Help:    "Time one collection of all GPU readings took.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_collection_errors_total",
			Help: "Collection cycles in which reading a GPU (by UUID) failed or timed out.",
		}, []string{"device"}),
	}
	if cfg.PodResourcesSocket != "" {
		c.pods = newPodAttributor(cfg.PodResourcesSocket, log)
	}
	empty := []prometheus.Metric{}
	c.snapshot.Store(&empty)
	for _, col := range []prometheus.Collector{c, c.duration, c.errors} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register gpu metrics collector: %w", err)
		}
	}
	if c.pods != nil {
		if err := reg.Register(c.pods.errors); err != nil {
			return nil, fmt.Errorf("register pod attribution metrics: %w", err)
		}
	}
	return c, nil
}

// SetNode sets the GPUs and MIG devices to read (after discovery, and
// again after a MIG reconfiguration) and asks Run for a fresh collection.
// It never waits for a collection in progress (a hung GPU read must not
// hold up the caller, the agent's reconcile loop); the next collection
// drops the per-GPU state and error series of GPUs no longer in n.
func (c *Collector) SetNode(n *topology.Node) {
	c.node.Store(n)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// pruneLocked forgets GPUs that are not in n. A GPU whose read is still
// running keeps its busy flag, so that if it comes back no second read of
// it can start while the first is hung; a later SetNode drops it.
func (c *Collector) pruneLocked(n *topology.Node) {
	present := map[string]bool{}
	if n != nil {
		for _, g := range n.GPUs {
			present[g.UUID] = true
		}
	}
	// Every GPU that was read has a busy entry, so these are all the
	// UUIDs that can have an errors series.
	for uuid, flag := range c.busy {
		if present[uuid] {
			continue
		}
		c.errors.DeleteLabelValues(uuid)
		delete(c.failing, uuid)
		if !flag.Load() {
			delete(c.busy, uuid)
		}
	}
}

// Run collects immediately, then every Interval, until ctx is done.
func (c *Collector) Run(ctx context.Context) error {
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	defer c.pods.close()
	for {
		c.CollectNow(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.kick:
		}
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it only replays the cached
// snapshot of const metrics built by the last collection.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range *c.snapshot.Load() {
		ch <- m
	}
}

// CollectNow runs one collection cycle and replaces the snapshot. Run
// calls it on the interval; it is exported for tests and benchmarks that
// need a deterministic number of cycles.
func (c *Collector) CollectNow(ctx context.Context) {
	c.collect.Lock()
	defer c.collect.Unlock()
	start := time.Now()
	node := c.node.Load()
	c.pruneLocked(node)
	if node == nil {
		return
	}

	var podsDone chan podMap
	if c.pods != nil {
		podsDone = make(chan podMap, 1)
		go func() { podsDone <- c.pods.refresh(ctx, c.cfg.DeviceTimeout) }()
	}

	results := c.readAll(ctx, node)

	var pods podMap
	if podsDone != nil {
		pods = <-podsDone
	}
	if ctx.Err() != nil {
		// Stopping: keep the last complete snapshot rather than a partial one.
		return
	}
	metrics := c.render(node, results, pods)
	c.snapshot.Store(&metrics)
	c.duration.Observe(time.Since(start).Seconds())
}

// readAll reads every GPU on its own goroutine and waits for each at most
// DeviceTimeout. A GPU that did not answer in time (or is still busy from
// an earlier cycle) has no result and counts one collection error.
func (c *Collector) readAll(ctx context.Context, node *topology.Node) []*gpuResult {
	type done struct {
		i   int
		res *gpuResult
	}
	results := make([]*gpuResult, len(node.GPUs))
	started := make([]bool, len(node.GPUs))
	ch := make(chan done, len(node.GPUs)) // buffered: late readers never block
	waiting := 0
	for i := range node.GPUs {
		g := &node.GPUs[i]
		flag := c.busy[g.UUID]
		if flag == nil {
			flag = &atomic.Bool{}
			c.busy[g.UUID] = flag
		}
		if !flag.CompareAndSwap(false, true) {
			c.recordFailure(g.UUID, errors.New("previous read still running"))
			continue
		}
		waiting++
		started[i] = true
		go func() {
			res := readGPU(c.lib, g, c.cfg.XIDs)
			// Clear the flag before handing the result over: once the
			// collector has the result, the next cycle (or a prune) must
			// see this GPU as idle. ch is buffered, so the send never blocks.
			flag.Store(false)
			ch <- done{i, res}
		}()
	}
	timer := time.NewTimer(c.cfg.DeviceTimeout)
	defer timer.Stop()
wait:
	for waiting > 0 {
		select {
		case d := <-ch:
			results[d.i] = d.res
			waiting--
		case <-timer.C:
			break wait
		case <-ctx.Done():
			return nil
		}
	}
	// A reader that finished between the deadline and here still counts.
drain:
	for {
		select {
		case d := <-ch:
			results[d.i] = d.res
		default:
			break drain
		}
	}
	for i, res := range results {
		uuid := node.GPUs[i].UUID
		switch {
		case res == nil:
			if started[i] {
				c.recordFailure(uuid, fmt.Errorf("read timed out after %s", c.cfg.DeviceTimeout))
			}
		case len(res.errs) > 0:
			c.recordFailure(uuid, errors.Join(res.errs...))
		default:
			if c.failing[uuid] {
				c.log.Info("gpu readings recovered", "device", uuid)
				delete(c.failing, uuid)
			}
		}
	}
	return results
}

func (c *Collector) recordFailure(uuid string, err error) {
	c.errors.WithLabelValues(uuid).Inc()
	if !c.failing[uuid] {
		c.log.Warn("gpu readings failed", "device", uuid, "err", err)
		c.failing[uuid] = true
		return
	}
	c.log.Debug("gpu readings failed", "device", uuid, "err", err)
}

// render turns one cycle's readings into const metrics. Building them here,
// once per cycle, keeps label handling off the scrape path.
func (c *Collector) render(node *topology.Node, results []*gpuResult, pods podMap) []prometheus.Metric {
	out := make([]prometheus.Metric, 0, countPresent(results))
	var lv [numDeviceLabels]string
	for i, res := range results {
		if res == nil {
			continue
		}
		g := &node.GPUs[i]
		lv = [numDeviceLabels]string{
			strconv.Itoa(g.Index), g.UUID, g.PCIBusID, "nvidia" + strconv.Itoa(g.Minor),
			g.Model, c.cfg.Hostname, "", "", "", "", "",
		}
		pods.fill(g.UUID, lv[8:])
		out = c.appendReading(out, &res.gpu, lv[:])
		for j := range g.MIG {
			m := &g.MIG[j]
			lv[6], lv[7] = m.Profile, strconv.Itoa(m.GPUInstance)
			lv[8], lv[9], lv[10] = "", "", ""
			pods.fill(m.UUID, lv[8:])
			out = c.appendReading(out, &res.migs[j], lv[:])
		}
	}
	return out
}

func (c *Collector) appendReading(out []prometheus.Metric, r *reading, lv []string) []prometheus.Metric {
	for f := range numFields {
		if !r.present[f] {
			continue
		}
		out = append(out, prometheus.MustNewConstMetric(c.descs[f], fieldSpecs[f].typ, r.values[f], lv...))
	}
	return out
}

func countPresent(results []*gpuResult) int {
	n := 0
	for _, res := range results {
		if res == nil {
			continue
		}
		for _, p := range res.gpu.present {
			if p {
				n++
			}
		}
		n += 2 * len(res.migs)
	}
	return n
}

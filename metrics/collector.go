package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// Defaults of the agent's metrics configuration.
const (
	// DefaultInterval is the default of the agent's metrics.interval:
	// the NVML sampler's interval, which is also how often the metrics
	// are refreshed.
	DefaultInterval = nvmlowner.DefaultSampleInterval
)

// Config configures a Collector.
type Config struct {
	// Hostname is the Hostname label (the node name in Kubernetes).
	Hostname string
	// Pods labels each device's series with the pod, namespace and
	// container holding it (the usage tracker, which lists the kubelet's
	// pod resources once per sampling cycle); nil disables attribution.
	// With it the collector renders after each of its cycles rather than
	// the sampler's, so a render carries that cycle's pods.
	Pods PodSource
	// XIDs feeds DCGM_FI_DEV_XID_ERRORS; nil omits that metric.
	XIDs XIDSource
	// Names says under which names the DCGM_ series are served
	// (metrics.dcgmNames); "" is DefaultDCGMNames. NewCollector refuses
	// an unknown value.
	Names DCGMNames
	// DRALabels adds dcgm-exporter's DRA labels (dra_claim_name,
	// dra_claim_namespace, dra_driver_name, dra_pool_name,
	// dra_device_name) to every DCGM_ series, set on the series of a
	// device a DRA claim holds (from Pods), empty on the others. The
	// agent sets it when it serves DRA with pod attribution on, as
	// dcgm-exporter adds them with --kubernetes-enable-dra.
	DRALabels bool
}

// PodSource says which container holds each device: *usage.Tracker.
type PodSource interface {
	// Assignments is the kubelet's answer of the last cycle; nil when
	// unknown (the series are then unattributed).
	Assignments() *usage.Assignments
	// Subscribe is signalled (coalesced) after each cycle.
	Subscribe() <-chan struct{}
}

// Collector serves the NVML sampler's readings as dcgm-exporter compatible
// metrics. After every sampling cycle (and every SetNode) it renders the
// latest nvmlowner.Snapshot, labelled from the node's topology, into an
// immutable cached set of const metrics; Collect only replays that set, so
// a scrape never waits on NVML, the sampler or the kubelet.
type Collector struct {
	sampler *nvmlowner.Sampler
	// updates is the pod source's subscription, or the sampler's without
	// one (nil without either).
	updates <-chan struct{}
	cfg     Config
	log     *slog.Logger
	// descs are, per field, one Desc per name it is served under.
	descs [numFields][]*prometheus.Desc
	// unavailable is gpu_node_agent_nvml_field_unavailable, rendered
	// with the DCGM series so it always matches the latest sample.
	unavailable *prometheus.Desc
	// pods are the holder and per-pod series (pods.go).
	pods podDescs
	// lastRead is gpu_node_agent_last_collection_timestamp_seconds.
	lastRead *prometheus.Desc

	node     atomic.Pointer[topology.Node]
	snapshot atomic.Pointer[[]prometheus.Metric]
	kick     chan struct{}

	// mu serialises refreshes and guards the per-GPU state below.
	mu sync.Mutex
	// lastSeq is the last sampling cycle accounted for: a re-render of
	// the same cycle (after SetNode) counts no second error.
	lastSeq uint64
	// failing holds the GPUs whose last cycle failed, so a failure and a
	// recovery are logged once each; errSeries the GPUs with an errors
	// series; noDataSeen the (GPU, field, reason) already logged.
	failing    map[string]bool
	errSeries  map[string]bool
	noDataSeen map[noDataKey]bool
	// readAt is, per GPU, the time of its last sample that read it (no
	// Err): what the staleness alert compares with the clock.
	readAt map[string]time.Time
	// rendered, when set (tests), is called after every refresh.
	rendered func()

	duration prometheus.Histogram
	errors   *prometheus.CounterVec
}

type noDataKey struct {
	uuid   string
	field  string
	reason string
}

// NewCollector returns a Collector over the sampler s and registers it,
// with its own gpu_node_agent_collection_* metrics, on reg. It calls no
// NVML: the agent runs s and sets its targets (SamplerTargets). Call
// SetNode for the labels; until then nothing is served.
func NewCollector(s *nvmlowner.Sampler, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Collector, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	names, err := ParseDCGMNames(string(cfg.Names))
	if err != nil {
		return nil, err
	}
	cfg.Names = names
	c := &Collector{
		sampler: s,
		cfg:     cfg,
		log:     log,
		descs:   newFieldDescs(names, cfg.DRALabels),
		unavailable: prometheus.NewDesc("gpu_node_agent_nvml_field_unavailable",
			"1 for each NVML reading (field) a GPU, by UUID, does not give: reason not-supported "+
				"(the device has no such reading) or no-permission (this process may not read it). No data, not a fault.",
			[]string{"device", "field", "reason"}, nil),
		pods: newPodDescs(),
		lastRead: prometheus.NewDesc("gpu_node_agent_last_collection_timestamp_seconds",
			"When a GPU (by UUID) was last read, as Unix time: the start of the last sampling cycle in which NVML answered for it "+
				"(single readings may still have failed). A GPU that is lost, hung or unreadable because NVML fails keeps its last time; "+
				"absent until the GPU was read once.",
			[]string{"device"}, nil),
		kick:       make(chan struct{}, 1),
		failing:    map[string]bool{},
		errSeries:  map[string]bool{},
		noDataSeen: map[noDataKey]bool{},
		readAt:     map[string]time.Time{},
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "gpu_node_agent_collection_duration_seconds",
			Help: "Time one refresh of the GPU metrics took: rendering the latest NVML sample with its pod attribution.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
				0.25, 0.5, 1, 2.5, 5},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_collection_errors_total",
			Help: "NVML sampling cycles in which a GPU (by UUID) could not be read (lost, timed out, library failure) or a reading failed; not-supported and no-permission readings do not count.",
		}, []string{"device"}),
	}
	switch {
	case cfg.Pods != nil:
		// The pod source runs a cycle after every sampling cycle.
		c.updates = cfg.Pods.Subscribe()
	case s != nil:
		c.updates = s.Subscribe()
	}
	empty := []prometheus.Metric{}
	c.snapshot.Store(&empty)
	for _, col := range []prometheus.Collector{c, c.duration, c.errors} {
		if err := reg.Register(col); err != nil {
			return nil, fmt.Errorf("register gpu metrics collector: %w", err)
		}
	}
	return c, nil
}

// SetNode sets the topology the samples are labelled with (after
// discovery, and again after a MIG reconfiguration) and asks Run for a
// fresh render. It never waits for a render in progress; the next render drops the series and per-GPU
// state of GPUs no longer in n. A sample whose UUID is not in n is not
// served; a GPU of n without a sample has no series.
func (c *Collector) SetNode(n *topology.Node) {
	c.node.Store(n)
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Run renders at once, then after every sampling cycle and every
// SetNode, until ctx is done.
func (c *Collector) Run(ctx context.Context) error {
	for {
		c.Refresh(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-c.updates:
		case <-c.kick:
		}
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, ds := range c.descs {
		for _, d := range ds {
			ch <- d
		}
	}
	ch <- c.unavailable
	ch <- c.lastRead
	c.pods.describe(ch)
}

// Collect implements prometheus.Collector: it only replays the cached
// snapshot of const metrics built by the last refresh (never a call to
// NVML or the kubelet).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range *c.snapshot.Load() {
		ch <- m
	}
}

// Refresh renders the sampler's latest snapshot now and replaces the
// cached metrics. Run calls it; tests and benchmarks call it for a
// deterministic number of renders (after Sampler.SampleNow).
func (c *Collector) Refresh(ctx context.Context) {
	var snap *nvmlowner.Snapshot
	if c.sampler != nil {
		snap = c.sampler.Latest()
	}
	c.refresh(ctx, snap)
}

// refresh renders snap (nil: nothing sampled yet).
func (c *Collector) refresh(ctx context.Context, snap *nvmlowner.Snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := time.Now()
	node := c.node.Load()
	c.prune(node)

	var pods *usage.Assignments
	if c.cfg.Pods != nil {
		pods = c.cfg.Pods.Assignments()
	}
	if ctx.Err() != nil {
		// Stopping: keep the last complete render.
		return
	}
	samples := map[string]*nvmlowner.Sample{}
	if snap != nil && node != nil {
		inNode := make(map[string]bool, len(node.GPUs))
		for _, g := range node.GPUs {
			inNode[g.UUID] = true
		}
		for i := range snap.Samples {
			if s := &snap.Samples[i]; inNode[s.UUID] {
				samples[s.UUID] = s
			}
		}
		if snap.Seq != c.lastSeq {
			c.lastSeq = snap.Seq
			c.account(node, samples)
		}
	}
	metrics := c.render(node, samples, pods)
	c.snapshot.Store(&metrics)
	c.duration.Observe(time.Since(start).Seconds())
	if c.rendered != nil {
		c.rendered()
	}
}

// prune forgets GPUs that are not in n: their errors series, failure
// marks and no-data log marks.
func (c *Collector) prune(n *topology.Node) {
	present := map[string]bool{}
	if n != nil {
		for _, g := range n.GPUs {
			present[g.UUID] = true
		}
	}
	for uuid := range c.errSeries {
		if !present[uuid] {
			c.errors.DeleteLabelValues(uuid)
			delete(c.errSeries, uuid)
		}
	}
	for uuid := range c.failing {
		if !present[uuid] {
			delete(c.failing, uuid)
		}
	}
	for k := range c.noDataSeen {
		if !present[k.uuid] {
			delete(c.noDataSeen, k)
		}
	}
	for uuid := range c.readAt {
		if !present[uuid] {
			delete(c.readAt, uuid)
		}
	}
}

// account counts one new sampling cycle: collection errors, and a log
// line when a GPU starts or stops failing and the first time a reading
// is seen unavailable.
func (c *Collector) account(node *topology.Node, samples map[string]*nvmlowner.Sample) {
	for _, g := range node.GPUs {
		s := samples[g.UUID]
		if s == nil {
			continue
		}
		if s.Err == nil && s.Time.After(c.readAt[g.UUID]) {
			c.readAt[g.UUID] = s.Time
		}
		if err := sampleError(s); err != nil {
			c.errors.WithLabelValues(g.UUID).Inc()
			c.errSeries[g.UUID] = true
			if !c.failing[g.UUID] {
				c.log.Warn("gpu readings failed", "device", g.UUID, "err", err)
				c.failing[g.UUID] = true
			} else {
				c.log.Debug("gpu readings failed", "device", g.UUID, "err", err)
			}
		} else if c.failing[g.UUID] {
			c.log.Info("gpu readings recovered", "device", g.UUID)
			delete(c.failing, g.UUID)
		}
		for _, r := range readings(s) {
			reason := unavailableReason(r.v)
			if reason == "" {
				continue
			}
			k := noDataKey{g.UUID, r.field, reason}
			if !c.noDataSeen[k] {
				c.noDataSeen[k] = true
				c.log.Debug("nvml reading unavailable: no data, not a fault", "device", g.UUID, "field", r.field, "reason", reason)
			}
		}
	}
}

// render turns one cycle's samples into const metrics. Building them here,
// once per cycle, keeps label handling off the scrape path.
func (c *Collector) render(node *topology.Node, samples map[string]*nvmlowner.Sample, pods *usage.Assignments) []prometheus.Metric {
	if node == nil {
		return []prometheus.Metric{}
	}
	out := make([]prometheus.Metric, 0, countSeries(samples))
	var lv [numDeviceLabels]string
	for i := range node.GPUs {
		g := &node.GPUs[i]
		if at, ok := c.readAt[g.UUID]; ok {
			out = append(out, prometheus.MustNewConstMetric(c.lastRead, prometheus.GaugeValue, float64(at.UnixNano())/1e9, g.UUID))
		}
		s := samples[g.UUID]
		if s == nil {
			continue
		}
		lv = [numDeviceLabels]string{
			strconv.Itoa(g.Index), g.UUID, nvmlBusID(g.PCIBusID), "nvidia" + strconv.Itoa(g.Minor),
			g.Model, c.cfg.Hostname, "", "", "", "", "", node.Host.DriverVersion,
		}
		holders := pods.Holders(g.UUID)
		lv[8], lv[9], lv[10] = dcgmPodLabels(holders)
		labels := lv[:numPlainLabels]
		if c.cfg.DRALabels {
			setClaimLabels(&lv, pods, g.UUID)
			labels = lv[:]
		}
		if pods != nil {
			out = c.pods.render(out, g, nil, holders)
		}
		for f := range numFields {
			var v float64
			var ok bool
			switch {
			case fromLinks(f):
				v, ok = linkValue(f, s.Links)
			case fieldSpecs[f].src != noSource:
				v, ok = valueOf(f, s.Values[fieldSpecs[f].src])
			}
			if ok {
				out = c.appendField(out, f, v, labels)
			}
		}
		if c.cfg.XIDs != nil {
			// Even for a GPU that could not be read: its last XID (79,
			// fallen off the bus) says why.
			xid, _ := c.cfg.XIDs.LastXID(g.UUID)
			out = c.appendField(out, fieldXIDErrors, float64(xid), labels)
		}
		for _, r := range readings(s) {
			if reason := unavailableReason(r.v); reason != "" {
				out = append(out, prometheus.MustNewConstMetric(c.unavailable, prometheus.GaugeValue, 1, g.UUID, r.field, reason))
			}
		}
		for j := range g.MIG {
			m := &g.MIG[j]
			holders := pods.Holders(m.UUID)
			if pods != nil {
				out = c.pods.render(out, g, m, holders)
			}
			ms := findMIG(s, m.UUID)
			if ms == nil {
				continue
			}
			lv[6], lv[7] = m.Profile, strconv.Itoa(m.GPUInstance)
			lv[8], lv[9], lv[10] = dcgmPodLabels(holders)
			if c.cfg.DRALabels {
				setClaimLabels(&lv, pods, m.UUID)
			}
			for _, r := range []struct {
				f field
				v nvmlowner.Value
			}{{fieldFBUsed, ms.FBUsed}, {fieldFBFree, ms.FBFree}} {
				if v, ok := valueOf(r.f, r.v); ok {
					out = c.appendField(out, r.f, v, labels)
				}
			}
		}
	}
	return out
}

// appendField appends field f's series, one per name it is served
// under, with value v and label values lv.
func (c *Collector) appendField(out []prometheus.Metric, f field, v float64, lv []string) []prometheus.Metric {
	for _, d := range c.descs[f] {
		out = append(out, prometheus.MustNewConstMetric(d, fieldSpecs[f].typ, v, lv...))
	}
	return out
}

// setClaimLabels sets the DRA labels of lv to the claim holding device
// id, or empty when no DRA claim of ours holds it (usage.Assignments.Claim).
func setClaimLabels(lv *[numDeviceLabels]string, pods *usage.Assignments, id string) {
	cl, _ := pods.Claim(id)
	lv[12], lv[13], lv[14], lv[15], lv[16] = cl.Name, cl.Namespace, cl.Driver, cl.Pool, cl.Device
}

// findMIG returns s's reading of MIG device uuid, nil if it has none
// (the topology changed since the sampler's targets were set).
func findMIG(s *nvmlowner.Sample, uuid string) *nvmlowner.MIGSample {
	for i := range s.MIG {
		if s.MIG[i].UUID == uuid {
			return &s.MIG[i]
		}
	}
	return nil
}

// countSeries sizes a render: every sampled reading plus XID, last read
// time and MIG framebuffer, an upper bound.
func countSeries(samples map[string]*nvmlowner.Sample) int {
	n := 0
	for _, s := range samples {
		for _, v := range s.Values {
			if v.Status != nvmlowner.Absent {
				n++
			}
		}
		n += 2 + 2*len(s.MIG)
		if len(s.Links) > 0 {
			n += int(numFields - fieldNVLinkEffectiveErrors)
		}
	}
	// The renamed fields' second names (mode both).
	n *= 2
	return n
}

// nvmlBusID spells a bus ID as NVML's nvmlPciInfo_t.busId does, which is
// what DCGM and dcgm-exporter put in pci_bus_id ("00000000:1B:00.0" in
// dcgm-exporter 4.5.3-4.8.2 internal/pkg/transformation/
// kubernetes_mig_test.go, and in its users' scrapes): an eight-digit
// domain and upper-case hex. The model keeps sysfs's "0000:1b:00.0".
func nvmlBusID(id string) string {
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return strings.ToUpper(id)
	}
	d, err := strconv.ParseUint(domain, 16, 32)
	if err != nil {
		return strings.ToUpper(id)
	}
	return fmt.Sprintf("%08X:%s", d, strings.ToUpper(rest))
}

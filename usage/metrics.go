package usage

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Attribution sources, as gpu_node_agent_gpu_process_attribution names
// them.
const (
	SourcePodResources = "pod-resources"
	SourceCheckpoint   = "checkpoint"
	SourcePodLogs      = "pod-logs"
	SourceHostPIDs     = "host-pids"
)

// trackerMetrics are the tracker's series. The per-device gauges are
// rendered once per cycle into const metrics that Collect replays, so a
// scrape never waits on a cycle.
type trackerMetrics struct {
	processes, memory, findings, attribution *prometheus.Desc
	snapshot                                 atomic.Pointer[[]prometheus.Metric]
	kills                                    *prometheus.CounterVec

	// mu guards sources: each attribution source's last error ("" when
	// it worked), so a change is logged once.
	mu      sync.Mutex
	sources map[string]string
}

func newTrackerMetrics(reg prometheus.Registerer, pods *podResourcesClient) (*trackerMetrics, error) {
	m := &trackerMetrics{
		processes: prometheus.NewDesc("gpu_node_agent_gpu_processes",
			"Processes NVML lists on a GPU or MIG device (by UUID), by class: own (of a pod assigned the device), "+
				"zombie (of a pod that is gone, or of the host, on a device no running pod is assigned), "+
				"foreign (of another pod or the host on an assigned device, or of a running pod on a device not assigned to it), "+
				"unknown (not attributable this cycle). Current classes, before the grace period.",
			[]string{"device", "class"}, nil),
		memory: prometheus.NewDesc("gpu_node_agent_gpu_process_memory_bytes",
			"Device memory held on a GPU or MIG device (by UUID), by class of the processes holding it; "+
				"class leaked is memory allocated with no process on the device.",
			[]string{"device", "class"}, nil),
		findings: prometheus.NewDesc("gpu_node_agent_gpu_process_findings",
			"Findings of the GPU process check that have lasted health.zombies.grace on a device (by UUID), by class "+
				"(zombie, leaked, foreign): the device is unhealthy while one lasts.",
			[]string{"device", "class"}, nil),
		attribution: prometheus.NewDesc("gpu_node_agent_gpu_process_attribution",
			"1 when a source the GPU process check attributes processes from was usable in the last cycle: "+
				"pod-resources (the kubelet's List), checkpoint (its device-manager checkpoint), pod-logs (its pod log "+
				"directories: every running pod's UID), host-pids (the agent sees the host's PIDs).",
			[]string{"source"}, nil),
		kills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_zombie_kills_total",
			Help: "Signals sent to zombie GPU processes (health.zombies.action kill), by signal.",
		}, []string{"signal"}),
		sources: map[string]string{},
	}
	empty := []prometheus.Metric{}
	m.snapshot.Store(&empty)
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{m, m.kills}
	if pods != nil {
		cs = append(cs, pods.errors)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *trackerMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.processes
	ch <- m.memory
	ch <- m.findings
	ch <- m.attribution
}

// Collect implements prometheus.Collector: the last cycle's render.
func (m *trackerMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, x := range *m.snapshot.Load() {
		ch <- x
	}
}

// noteSource records whether an attribution source worked this cycle and
// logs when that changes.
func (m *trackerMetrics) noteSource(log *slog.Logger, source string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	m.mu.Lock()
	last, seen := m.sources[source]
	m.sources[source] = msg
	m.mu.Unlock()
	switch {
	case seen && last == msg:
	case msg != "":
		log.Warn("gpu process attribution source unusable", "source", source, "err", msg)
	case seen:
		log.Info("gpu process attribution source usable again", "source", source)
	}
}

// render replaces the per-device series with this cycle's.
func (m *trackerMetrics) render(verdicts []deviceVerdict, findings map[findingKey]*finding, attr attribution, listed bool) {
	var out []prometheus.Metric
	for _, dv := range verdicts {
		count := map[Class]int{}
		mem := map[Class]uint64{}
		for _, v := range dv.verdicts {
			if v.Class != ClassLeaked {
				count[v.Class]++
			}
			if v.MemoryKnown {
				mem[v.Class] += v.Memory
			}
		}
		for _, c := range slices.Sorted(maps.Keys(count)) {
			out = append(out, prometheus.MustNewConstMetric(m.processes, prometheus.GaugeValue, float64(count[c]), dv.ID, string(c)))
		}
		for _, c := range slices.Sorted(maps.Keys(mem)) {
			out = append(out, prometheus.MustNewConstMetric(m.memory, prometheus.GaugeValue, float64(mem[c]), dv.ID, string(c)))
		}
	}
	flagged := map[[2]string]int{}
	for k, f := range findings {
		if f.flagged {
			flagged[[2]string{k.device, string(k.class)}]++
		}
	}
	for _, k := range slices.SortedFunc(maps.Keys(flagged), func(a, b [2]string) int {
		if a[0] != b[0] {
			return cmp.Compare(a[0], b[0])
		}
		return cmp.Compare(a[1], b[1])
	}) {
		out = append(out, prometheus.MustNewConstMetric(m.findings, prometheus.GaugeValue, float64(flagged[k]), k[0], k[1]))
	}
	m.mu.Lock()
	logsErr, logsRead := m.sources[SourcePodLogs]
	sources := map[string]bool{
		SourcePodResources: listed,
		SourceCheckpoint:   listed && attr.checkpointOK,
		SourcePodLogs:      listed && logsRead && logsErr == "",
		SourceHostPIDs:     attr.pids,
	}
	m.mu.Unlock()
	for _, s := range slices.Sorted(maps.Keys(sources)) {
		v := 0.0
		if sources[s] {
			v = 1
		}
		out = append(out, prometheus.MustNewConstMetric(m.attribution, prometheus.GaugeValue, v, s))
	}
	if out == nil {
		out = []prometheus.Metric{}
	}
	m.snapshot.Store(&out)
}

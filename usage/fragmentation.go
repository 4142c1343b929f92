// This file holds the fragmentation metrics: what the node has free for
// a new pod, as topology.FreeDevices computes it, rendered for Prometheus.

package usage

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Fragmentation is a prometheus.Collector of the node's free capacity:
// free whole GPUs, free GPUs per NUMA node, the largest NVLink-connected
// block of free GPUs and free MIG devices per profile. These change with
// every pod, so they are metrics rather than Node labels (no API write
// per pod). Update computes them once per sampler cycle; a scrape only
// renders the last result and waits on nothing.
type Fragmentation struct {
	free      *prometheus.Desc
	freeNUMA  *prometheus.Desc
	block     *prometheus.Desc
	freeMIG   *prometheus.Desc
	collected atomic.Pointer[[]prometheus.Metric]
}

// NewFragmentation returns a Fragmentation whose series carry the
// Hostname label (the node name, as dcgm-exporter's series do, so fleet
// dashboards can tell nodes apart and filter them like the DCGM_ series).
// It reports nothing until the first Update.
func NewFragmentation(hostname string) *Fragmentation {
	cl := prometheus.Labels{"Hostname": hostname}
	return &Fragmentation{
		free: prometheus.NewDesc("gpu_node_agent_free_gpus",
			"Whole GPUs the kubelet could give a new pod now: healthy, not lost, not in MIG mode, and neither they nor a replica or MIG device of them allocated to any pod.",
			nil, cl),
		freeNUMA: prometheus.NewDesc("gpu_node_agent_free_gpus_by_numa",
			"Free whole GPUs by the NUMA node they are attached to (numa_node -1: the platform reports none); what a pod needing its GPUs on one NUMA node can get.",
			[]string{"numa_node"}, cl),
		block: prometheus.NewDesc("gpu_node_agent_largest_free_nvlink_block_gpus",
			"The most free GPUs of which every pair is NVLink-connected (directly or through one NVSwitch fabric): the largest all-NVLink job a single pod could start on this node now.",
			nil, cl),
		freeMIG: prometheus.NewDesc("gpu_node_agent_free_mig_devices",
			"Free MIG devices by profile (healthy, their GPU not lost, allocated to no pod); 0 for a profile configured on the node with none free.",
			[]string{"profile"}, cl),
	}
}

// Update recomputes the free capacity of n: offered says whether a device
// (GPU or MIG UUID) is offered to the kubelet, allocated holds the device
// IDs the kubelet assigned to pods (GPU and MIG UUIDs, replicas
// "<uuid>::<n>"); see topology.FreeDevices. A nil n (no discovery yet)
// withdraws every series. Safe to call concurrently with Collect.
func (f *Fragmentation) Update(n *topology.Node, offered func(id string) bool, allocated map[string]bool) {
	if n == nil {
		f.collected.Store(nil)
		return
	}
	r := topology.FreeDevices(n, offered, allocated)
	ms := []prometheus.Metric{
		prometheus.MustNewConstMetric(f.free, prometheus.GaugeValue, float64(r.GPUs)),
		prometheus.MustNewConstMetric(f.block, prometheus.GaugeValue, float64(len(r.NVLinkBlock))),
	}
	for numa, c := range r.GPUsByNUMA {
		ms = append(ms, prometheus.MustNewConstMetric(f.freeNUMA, prometheus.GaugeValue, float64(c), strconv.Itoa(numa)))
	}
	for profile, c := range r.MIGByProfile {
		ms = append(ms, prometheus.MustNewConstMetric(f.freeMIG, prometheus.GaugeValue, float64(c), profile))
	}
	f.collected.Store(&ms)
}

// Describe implements prometheus.Collector.
func (f *Fragmentation) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.free
	ch <- f.freeNUMA
	ch <- f.block
	ch <- f.freeMIG
}

// Collect implements prometheus.Collector: it sends the metrics the last
// Update built, unchanged (const metrics are immutable).
func (f *Fragmentation) Collect(ch chan<- prometheus.Metric) {
	ms := f.collected.Load()
	if ms == nil {
		return
	}
	for _, m := range *ms {
		ch <- m
	}
}

// This file holds the fragmentation metrics: what the node has free for
// a new pod, as topology.FreeDevices computes it, rendered for Prometheus,
// and the move advice (topology.AdviseMoves): which pods to move to free
// a larger NVLink block.

package usage

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Fragmentation is a prometheus.Collector of the node's free capacity:
// free whole GPUs, free GPUs per NUMA node, the largest NVLink-connected
// block of free GPUs and free MIG devices per profile, and what moving
// the pods the move advice names would free. These change with every
// pod, so they are metrics rather than Node labels (no API write per
// pod). Update computes them once per sampler cycle; a scrape only
// renders the last result and waits on nothing. A changed move advice is
// handed to FragmentationOptions.Advice (the Node annotation).
type Fragmentation struct {
	free         *prometheus.Desc
	freeNUMA     *prometheus.Desc
	block        *prometheus.Desc
	freeMIG      *prometheus.Desc
	blockIfMoved *prometheus.Desc
	movePods     *prometheus.Desc
	wholeIfMoved *prometheus.Desc
	collected    atomic.Pointer[[]prometheus.Metric]
	advise       Advise
	adviceObs    AdviceObserver

	// mu guards the advice last handed to adviceObs.
	mu        sync.Mutex
	published bool
	last      topology.MoveAdvice
	lastUIDs  map[string]string
}

// Advise computes a node's move advice: topology.AdviseMoves, or a
// stand-in in tests.
type Advise func(n *topology.Node, offered func(id string) bool, holds []topology.PodHold) topology.MoveAdvice

// AdviceObserver is told the node's move advice after the first cycle and
// then whenever it changes (never twice the same in a row): the node
// object, which keeps the Node's move-advice annotation. podUIDs maps the
// advice's pods ("namespace/name") to their UIDs where the kubelet's
// assignments know them. It must not block.
type AdviceObserver interface {
	SetMoveAdvice(n *topology.Node, a topology.MoveAdvice, podUIDs map[string]string)
}

// FragmentationOptions are a Fragmentation's collaborators; both may be
// nil.
type FragmentationOptions struct {
	// Advise computes the move advice (nil: topology.AdviseMoves).
	Advise Advise
	// Advice is told each changed move advice (nil: the metrics alone,
	// as with placement.moveAdvice off).
	Advice AdviceObserver
}

// NewFragmentation returns a Fragmentation whose series carry the
// Hostname label (the node name, as dcgm-exporter's series do, so fleet
// dashboards can tell nodes apart and filter them like the DCGM_ series).
// It reports nothing until the first Update.
func NewFragmentation(hostname string, opts FragmentationOptions) *Fragmentation {
	cl := prometheus.Labels{"Hostname": hostname}
	if opts.Advise == nil {
		opts.Advise = topology.AdviseMoves
	}
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
		blockIfMoved: prometheus.NewDesc("gpu_node_agent_largest_free_nvlink_block_if_moved_gpus",
			"The largest free NVLink block once the pods of the move advice moved elsewhere (the next usable block size above the largest free block now); equal to gpu_node_agent_largest_free_nvlink_block_gpus when there is no advice. Advice only: the agent moves nothing.",
			nil, cl),
		movePods: prometheus.NewDesc("gpu_node_agent_move_advice_pods",
			"Pods the move advice suggests moving elsewhere to free a larger NVLink block on this node (the fewest that do); 0 when there is no advice. Advice only: the agent evicts nothing.",
			nil, cl),
		wholeIfMoved: prometheus.NewDesc("gpu_node_agent_whole_node_free_if_moved_gpus",
			"The node's GPUs that could serve a whole-GPU pod (healthy, not lost, not in MIG mode) when all of them are free once the advice's pods moved, or are free now; 0 otherwise.",
			nil, cl),
		advise:    opts.Advise,
		adviceObs: opts.Advice,
	}
}

// Update recomputes the free capacity of n and its move advice: offered
// says whether a device (GPU or MIG UUID) is offered to the kubelet, a
// holds the devices the kubelet assigned to pods (GPU and MIG UUIDs,
// replicas "<uuid>::<n>", DRA devices) and which pod holds each; see
// topology.FreeDevices and topology.AdviseMoves. A nil n (no discovery
// yet) withdraws every series and the advice. The advice observer is told
// the advice when it differs from the last one it was told. Safe to call
// concurrently with Collect.
func (f *Fragmentation) Update(n *topology.Node, offered func(id string) bool, a *Assignments) {
	if n == nil {
		f.collected.Store(nil)
		f.publish(nil, topology.MoveAdvice{}, nil)
		return
	}
	r := topology.FreeDevices(n, offered, a.Allocated())
	adv := f.advise(n, offered, a.Holds())
	whole := 0
	if adv.WholeNode {
		// Every whole-GPU-capable GPU is free once the pods moved: as
		// many as are free with no pod holding any.
		whole = topology.FreeDevices(n, offered, nil).GPUs
	}
	ms := []prometheus.Metric{
		prometheus.MustNewConstMetric(f.free, prometheus.GaugeValue, float64(r.GPUs)),
		prometheus.MustNewConstMetric(f.block, prometheus.GaugeValue, float64(len(r.NVLinkBlock))),
		prometheus.MustNewConstMetric(f.blockIfMoved, prometheus.GaugeValue, float64(adv.BlockIfMoved)),
		prometheus.MustNewConstMetric(f.movePods, prometheus.GaugeValue, float64(len(adv.Pods))),
		prometheus.MustNewConstMetric(f.wholeIfMoved, prometheus.GaugeValue, float64(whole)),
	}
	for numa, c := range r.GPUsByNUMA {
		ms = append(ms, prometheus.MustNewConstMetric(f.freeNUMA, prometheus.GaugeValue, float64(c), strconv.Itoa(numa)))
	}
	for profile, c := range r.MIGByProfile {
		ms = append(ms, prometheus.MustNewConstMetric(f.freeMIG, prometheus.GaugeValue, float64(c), profile))
	}
	f.collected.Store(&ms)
	var uids map[string]string
	for _, p := range adv.Pods {
		if uid := a.PodUID(p.Namespace, p.Name); uid != "" {
			if uids == nil {
				uids = map[string]string{}
			}
			uids[p.Namespace+"/"+p.Name] = uid
		}
	}
	f.publish(n, adv, uids)
}

// publish hands adv to the advice observer unless it was the last one
// handed (recomputed every cycle, told only on change: a node whose pods
// stay put costs the observer nothing).
func (f *Fragmentation) publish(n *topology.Node, adv topology.MoveAdvice, uids map[string]string) {
	if f.adviceObs == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.published && sameAdvice(f.last, adv) && maps.Equal(f.lastUIDs, uids) {
		return
	}
	f.published, f.last, f.lastUIDs = true, adv, uids
	f.adviceObs.SetMoveAdvice(n, adv, uids)
}

// sameAdvice says whether a and b advise the same (nil and empty lists
// alike).
func sameAdvice(a, b topology.MoveAdvice) bool {
	return a.BlockNow == b.BlockNow && a.BlockIfMoved == b.BlockIfMoved && a.WholeNode == b.WholeNode &&
		slices.Equal(a.Block, b.Block) && slices.EqualFunc(a.Pods, b.Pods, func(x, y topology.PodHold) bool {
		return x.Namespace == y.Namespace && x.Name == y.Name && slices.Equal(x.Devices, y.Devices)
	})
}

// Describe implements prometheus.Collector.
func (f *Fragmentation) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.free
	ch <- f.freeNUMA
	ch <- f.block
	ch <- f.freeMIG
	ch <- f.blockIfMoved
	ch <- f.movePods
	ch <- f.wholeIfMoved
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

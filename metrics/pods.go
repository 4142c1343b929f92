package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// Attribution of shared devices. A GPU or MIG device is shared when the
// kubelet assigned it to more than one container: time-slicing replicas
// ("<uuid>::<n>") of one device held by different containers. NVML's
// device readings are the whole device's, so they are never copied to
// each holder as if each used it all (dcgm-exporter issues #307, #151,
// #201, #587: with --kubernetes-virtual-gpus every pod gets the device's
// value). Instead:
//   - the DCGM_ series stay one per device; their pod, namespace and
//     container labels name the holder only when there is one (as
//     dcgm-exporter does for an unshared device), else only what all
//     holders have in common:
//     the pod and namespace when they are one pod's containers, nothing
//     when they are different pods;
//   - gpu_node_agent_gpu_holders counts a device's holders (above 1:
//     shared), and gpu_node_agent_pod_gpu_replicas lists each holder with
//     the number of the device's IDs it was assigned;
//   - the gpu_node_agent_pod_gpu_* series carry what each holder's own
//     processes use of the device, from NVML's per-process readings
//     (usage.Use), for shared and unshared devices alike, and only when
//     those processes could all be attributed.
// These series carry dcgm-exporter's device labels (gpu, UUID, GPU_I_ID,
// GPU_I_PROFILE) so that they join the DCGM_ series of their device.

// Labels of the holder and per-pod series.
var (
	holderLabels = []string{labelGPU, labelUUID, labelGIID, labelGIProfile}
	podUseLabels = []string{labelGPU, labelUUID, labelGIID, labelGIProfile, labelPod, labelNamespace, labelContainer}
)

// podDescs are the descriptors of the holder and per-pod series.
type podDescs struct {
	holders, replicas, processes, memory *prometheus.Desc
	// util are SM, memory, encoder and decoder utilisation.
	util [4]*prometheus.Desc
}

func newPodDescs() podDescs {
	util := func(name, what string) *prometheus.Desc {
		return prometheus.NewDesc("gpu_node_agent_pod_gpu_"+name+"_utilization_ratio",
			"Share of the time the "+what+" of a GPU (by UUID) ran work of the container's processes since the previous "+
				"sampling cycle (NVML's per-process samples, summed over the container's processes). Not given for "+
				"MIG devices or GPUs in MIG mode (NVML does not), nor when a process on the device could not be attributed.",
			podUseLabels, nil)
	}
	return podDescs{
		holders: prometheus.NewDesc("gpu_node_agent_gpu_holders",
			"Containers the kubelet has assigned a GPU or MIG device (by UUID and GPU_I_ID) or replicas of it: above 1 the "+
				"device is shared (time-slicing), and its DCGM_ series name no single pod.",
			holderLabels, nil),
		replicas: prometheus.NewDesc("gpu_node_agent_pod_gpu_replicas",
			"Device IDs of a GPU or MIG device (by UUID and GPU_I_ID) the kubelet assigned to the container: 1 for the "+
				"device itself or one time-slicing replica (<uuid>::<n>), n for n replicas.",
			podUseLabels, nil),
		processes: prometheus.NewDesc("gpu_node_agent_pod_gpu_processes",
			"Processes of the container on a GPU or MIG device it was assigned (by UUID and GPU_I_ID), as NVML lists them; "+
				"absent when a process on the device could not be attributed this cycle.",
			podUseLabels, nil),
		memory: prometheus.NewDesc("gpu_node_agent_pod_gpu_memory_used_bytes",
			"Device memory held by the container's processes on a GPU or MIG device it was assigned (by UUID and GPU_I_ID): "+
				"NVML's per-process used memory, summed; absent when a process's is not known.",
			podUseLabels, nil),
		util: [4]*prometheus.Desc{
			util("sm", "SMs (3D/compute)"),
			util("memory", "memory controller (frame-buffer reads and writes)"),
			util("encoder", "video encoder"),
			util("decoder", "video decoder"),
		},
	}
}

func (d *podDescs) describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{d.holders, d.replicas, d.processes, d.memory} {
		ch <- x
	}
	for _, x := range d.util {
		ch <- x
	}
}

// render appends the holder and per-pod series of one device: GPU g
// itself (m nil) or its MIG device m.
func (d *podDescs) render(out []prometheus.Metric, g *topology.GPU, m *topology.MIGDevice, holders []usage.Holder) []prometheus.Metric {
	lv := []string{strconv.Itoa(g.Index), g.UUID, "", ""}
	if m != nil {
		lv[2], lv[3] = strconv.Itoa(m.GPUInstance), m.Profile
	}
	out = append(out, prometheus.MustNewConstMetric(d.holders, prometheus.GaugeValue, float64(len(holders)), lv...))
	for _, h := range holders {
		pl := append(lv[:4:4], h.Pod, h.Namespace, h.Container)
		out = append(out, prometheus.MustNewConstMetric(d.replicas, prometheus.GaugeValue, float64(len(h.IDs)), pl...))
		u := h.Use
		if u == nil {
			continue
		}
		out = append(out, prometheus.MustNewConstMetric(d.processes, prometheus.GaugeValue, float64(u.Processes), pl...))
		if u.MemoryBytes != nil {
			out = append(out, prometheus.MustNewConstMetric(d.memory, prometheus.GaugeValue, float64(*u.MemoryBytes), pl...))
		}
		for i, v := range []*uint64{u.SMUtil, u.MemUtil, u.EncUtil, u.DecUtil} {
			if v != nil {
				out = append(out, prometheus.MustNewConstMetric(d.util[i], prometheus.GaugeValue, float64(*v)/100, pl...))
			}
		}
	}
	return out
}

// dcgmPodLabels are the pod, namespace and container labels of a device's
// DCGM_ series: its holder's when one container holds it; when several
// share it, only what they all have in common, so no pod is named for a
// value it shares with others.
func dcgmPodLabels(holders []usage.Holder) (pod, namespace, container string) {
	if len(holders) == 0 {
		return "", "", ""
	}
	pod, namespace, container = holders[0].Pod, holders[0].Namespace, holders[0].Container
	for _, h := range holders[1:] {
		if h.Pod != pod || h.Namespace != namespace {
			return "", "", ""
		}
		if h.Container != container {
			container = ""
		}
	}
	return pod, namespace, container
}

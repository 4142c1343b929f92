package topology

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// AnnotationNICs describes the node's RDMA NICs and their PCIe distance to
// each GPU, for operators and schedulers that place multi-node jobs. Its
// value is compact JSON, an object keyed by NIC (ibdev) name:
//
//	{"mlx5_0":{"numaNode":0,"linkLayer":"InfiniBand","pciBusID":"0000:04:00.0",
//	  "gpusByPCIe":{"single-switch":[0],"host-bridge":[1],"same-cpu":[2,3],"cross-cpu":[4,5,6,7]}}}
//
// numaNode is -1 when the platform reports none; linkLayer ("InfiniBand" or
// "Ethernet"), pciBusID and gpusByPCIe are left out when unknown or empty.
// gpusByPCIe lists GPU indexes (ascending) by their PCIe level (see
// PCIeLevel), levels nearest first. NICs are in name order, so equal nodes
// give equal values: the annotation is only rewritten when something
// changed. It is an annotation rather than labels because a label value
// cannot hold it (63 characters); 16 NICs × 16 GPUs take about 4 KiB.
const AnnotationNICs = "gpu-node-agent.io/nics"

// annotationKeys are the only annotation keys Annotations returns. The
// node labeler (kubeapi.Labeler) owns exactly these: it reads them back
// after a restart and removes them when they are no longer wanted.
var annotationKeys = []string{AnnotationNICs}

// AnnotationKeys returns every key Annotations can return (a copy).
func AnnotationKeys() []string { return slices.Clone(annotationKeys) }

// pcieLevels are the known PCIe levels, nearest first.
var pcieLevels = []PCIeLevel{PCIeSameBoard, PCIeSingleSwitch, PCIeMultiSwitch, PCIeHostBridge, PCIeSameCPU, PCIeCrossCPU}

// Annotations returns the node annotations that describe n: AnnotationNICs
// when n has NICs, nothing otherwise.
func Annotations(n *Node) map[string]string {
	out := map[string]string{}
	if n == nil || len(n.NICs) == 0 {
		return out
	}
	nics := make(map[string]nicAnnotation, len(n.NICs))
	for _, nic := range n.NICs {
		a := nicAnnotation{NUMANode: nic.NUMANode, LinkLayer: nic.LinkLayer, PCIBusID: nic.PCIBusID}
		for _, l := range nic.GPUs {
			a.GPUsByPCIe = a.GPUsByPCIe.add(l.PCIe, l.GPU)
		}
		nics[nic.Name] = a
	}
	// Cannot fail: strings, ints and gpusByLevel, whose MarshalJSON does not.
	b, _ := json.Marshal(nics)
	out[AnnotationNICs] = string(b)
	return out
}

// nicAnnotation is one NIC's entry in AnnotationNICs.
type nicAnnotation struct {
	NUMANode   int         `json:"numaNode"`
	LinkLayer  string      `json:"linkLayer,omitempty"`
	PCIBusID   string      `json:"pciBusID,omitempty"`
	GPUsByPCIe gpusByLevel `json:"gpusByPCIe,omitempty"`
}

// gpusByLevel groups GPU indexes by PCIe level. It is a slice rather than a
// map so that it marshals nearest level first (encoding/json sorts map keys
// alphabetically, which would put cross-cpu first).
type gpusByLevel []levelGPUs

type levelGPUs struct {
	level PCIeLevel
	gpus  []int
}

// add puts gpu under level, keeping levels in pcieLevels order (unknown
// ones after, by name) and each level's GPUs ascending.
func (g gpusByLevel) add(level PCIeLevel, gpu int) gpusByLevel {
	i := slices.IndexFunc(g, func(l levelGPUs) bool { return l.level == level })
	if i < 0 {
		g = append(g, levelGPUs{level: level})
		slices.SortStableFunc(g, func(a, b levelGPUs) int { return levelOrder(a.level, b.level) })
		i = slices.IndexFunc(g, func(l levelGPUs) bool { return l.level == level })
	}
	gpus := g[i].gpus
	j, found := slices.BinarySearch(gpus, gpu)
	if !found {
		g[i].gpus = slices.Insert(gpus, j, gpu)
	}
	return g
}

// levelOrder orders known levels nearest first, then unknown ones by name.
func levelOrder(a, b PCIeLevel) int {
	ra, rb := slices.Index(pcieLevels, a), slices.Index(pcieLevels, b)
	switch {
	case ra >= 0 && rb >= 0:
		return ra - rb
	case ra >= 0:
		return -1
	case rb >= 0:
		return 1
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// MarshalJSON writes {"level":[gpu,...],...} in the slice's order.
func (g gpusByLevel) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, l := range g {
		if i > 0 {
			b.WriteByte(',')
		}
		key, _ := json.Marshal(string(l.level)) // a string always marshals
		b.Write(key)
		b.WriteString(":[")
		for j, gpu := range l.gpus {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(gpu))
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

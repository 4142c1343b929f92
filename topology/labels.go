package topology

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Node label keys. The nvidia.com ones carry the names and meanings
// gpu-feature-discovery gives them, so node selectors written for GFD keep
// working; the gpu-node-agent.io ones describe wiring GFD does not label.
const (
	LabelGPUProduct  = "nvidia.com/gpu.product"
	LabelGPUCount    = "nvidia.com/gpu.count"
	LabelGPUMemory   = "nvidia.com/gpu.memory" // MiB
	LabelMIGCapable  = "nvidia.com/mig.capable"
	LabelMIGStrategy = "nvidia.com/mig.strategy"
	LabelNVLink      = "gpu-node-agent.io/nvlink"
	LabelNVSwitch    = "gpu-node-agent.io/nvswitch"
	LabelNUMANodes   = "gpu-node-agent.io/numa-nodes"
	// LabelNUMALayout lists GPUs per NUMA node: "0x4.1x4" is four GPUs on
	// NUMA node 0 and four on node 1.
	LabelNUMALayout = "gpu-node-agent.io/gpu-numa-layout"
)

// MIG strategies, as the NVIDIA device plugin and GFD name them.
const (
	MIGStrategyNone   = "none"
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"
)

// Labels returns the node labels that describe n under the given MIG
// strategy. A node without GPUs gets no labels. Like GFD:
//   - product, count and memory describe the GPUs (product and memory from
//     the lowest-index GPU that is not lost);
//   - with strategy "single" and every MIG device of one profile, they
//     describe the MIG devices instead (product "<model>-MIG-<profile>");
//   - with strategy "mixed", nvidia.com/mig-<profile>.count and .memory are
//     added per profile.
//
// gpu-node-agent.io/nvswitch is inferred, since the node model holds link
// counts rather than switches: at least three GPUs and every pair joined by
// the same non-zero number of NVLinks — what an NVSwitch fabric looks like.
// A direct full mesh with equal counts would read the same.
func Labels(n *Node, migStrategy string) map[string]string {
	if len(n.GPUs) == 0 {
		return map[string]string{}
	}
	l := map[string]string{LabelGPUCount: strconv.Itoa(len(n.GPUs))}
	var ref *GPU
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.Lost && (ref == nil || g.Index < ref.Index) {
			ref = g
		}
	}
	if ref != nil {
		if v := labelValue(ref.Model); v != "" {
			l[LabelGPUProduct] = v
		}
		if ref.MemoryMiB > 0 {
			l[LabelGPUMemory] = strconv.FormatUint(ref.MemoryMiB, 10)
		}
	}

	migCapable := slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.MIGCapable })
	l[LabelMIGCapable] = strconv.FormatBool(migCapable)
	if migCapable {
		if migStrategy == "" {
			migStrategy = MIGStrategyNone
		}
		l[LabelMIGStrategy] = migStrategy
		addMIGLabels(l, n, migStrategy, ref)
	}

	nvlink, uniform := false, len(n.GPUs) >= 3
	count := -1
	pairs := 0
	for _, k := range n.Links {
		if k.NVLinks > 0 {
			nvlink = true
		}
		if k.A == k.B {
			continue
		}
		pairs++
		if count == -1 {
			count = k.NVLinks
		}
		if k.NVLinks != count || k.NVLinks == 0 {
			uniform = false
		}
	}
	if pairs != len(n.GPUs)*(len(n.GPUs)-1)/2 {
		uniform = false // some pair is not linked at all
	}
	l[LabelNVLink] = strconv.FormatBool(nvlink)
	l[LabelNVSwitch] = strconv.FormatBool(uniform)

	perNUMA := map[int]int{}
	for _, g := range n.GPUs {
		if g.NUMANode >= 0 {
			perNUMA[g.NUMANode]++
		}
	}
	l[LabelNUMANodes] = strconv.Itoa(len(perNUMA))
	if len(perNUMA) > 0 {
		var parts []string
		for _, node := range slices.Sorted(maps.Keys(perNUMA)) {
			parts = append(parts, fmt.Sprintf("%dx%d", node, perNUMA[node]))
		}
		if v := labelValue(strings.Join(parts, ".")); v != "" {
			l[LabelNUMALayout] = v
		}
	}
	return l
}

// addMIGLabels adds the strategy-specific MIG labels.
func addMIGLabels(l map[string]string, n *Node, strategy string, ref *GPU) {
	type profile struct {
		count     int
		memoryMiB uint64
	}
	profiles := map[string]*profile{}
	for _, g := range n.GPUs {
		if g.Lost || !g.MIGEnabled {
			continue
		}
		for _, m := range g.MIG {
			p := profiles[m.Profile]
			if p == nil {
				p = &profile{memoryMiB: m.MemoryMiB}
				profiles[m.Profile] = p
			}
			p.count++
		}
	}
	switch strategy {
	case MIGStrategySingle:
		// GFD overrides the GPU labels only when the whole node is one
		// profile; anything else is not a valid single-strategy node.
		if len(profiles) != 1 {
			return
		}
		for name, p := range profiles {
			l[LabelGPUCount] = strconv.Itoa(p.count)
			if p.memoryMiB > 0 {
				l[LabelGPUMemory] = strconv.FormatUint(p.memoryMiB, 10)
			}
			if ref != nil {
				if v := labelValue(ref.Model + "-MIG-" + name); v != "" {
					l[LabelGPUProduct] = v
				}
			}
		}
	case MIGStrategyMixed:
		for name, p := range profiles {
			key := "nvidia.com/mig-" + name
			l[key+".count"] = strconv.Itoa(p.count)
			if p.memoryMiB > 0 {
				l[key+".memory"] = strconv.FormatUint(p.memoryMiB, 10)
			}
		}
	}
}

// labelValue turns s into a valid label value the way GFD does for product
// names (runs of spaces become "-"), replacing any other character a label
// value cannot hold with "-" and trimming it to 63 characters that start
// and end alphanumeric. It returns "" when nothing valid remains.
func labelValue(s string) string {
	s = strings.Join(strings.Fields(s), "-")
	b := []byte(s)
	for i, c := range b {
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	start, end := 0, len(b)
	for start < end && !isAlnum(b[start]) {
		start++
	}
	for end > start && !isAlnum(b[end-1]) {
		end--
	}
	return string(b[start:end])
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

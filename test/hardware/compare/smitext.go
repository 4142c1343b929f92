package compare

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// listGPU is one GPU of `nvidia-smi -L`:
//
//	GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
//	  MIG 1g.10gb     Device  0: (UUID: MIG-...)
type listGPU struct {
	index int
	name  string
	uuid  string
	// migs are the MIG devices' UUIDs by device index.
	migs map[int]string
}

var (
	listGPURE = regexp.MustCompile(`^GPU (\d+): (.*) \(UUID: ([^)]+)\)\s*$`)
	listMIGRE = regexp.MustCompile(`^\s+MIG .*Device\s+(\d+): \(UUID: ([^)]+)\)\s*$`)
)

// parseList reads `nvidia-smi -L` output; lines it does not know are
// skipped.
func parseList(s string) []*listGPU {
	var out []*listGPU
	var cur *listGPU
	for _, line := range strings.Split(s, "\n") {
		if m := listGPURE.FindStringSubmatch(line); m != nil {
			i, _ := strconv.Atoi(m[1])
			cur = &listGPU{index: i, name: m[2], uuid: m[3], migs: map[int]string{}}
			out = append(out, cur)
			continue
		}
		if m := listMIGRE.FindStringSubmatch(line); m != nil && cur != nil {
			i, _ := strconv.Atoi(m[1])
			cur.migs[i] = m[2]
		}
	}
	return out
}

// nvlinkGPU is one GPU of `nvidia-smi nvlink -s`:
//
//	GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)
//		 Link 0: 26.562 GB/s
//		 Link 1: <inactive>
type nvlinkGPU struct {
	index  int
	uuid   string
	links  []int
	active []int
}

var (
	nvlinkGPURE  = regexp.MustCompile(`^GPU (\d+): .*?(?:\(UUID: ([^)]+)\))?\s*$`)
	nvlinkLinkRE = regexp.MustCompile(`^\s+Link (\d+): (.*)$`)
)

// parseNVLinkStatus reads `nvidia-smi nvlink -s`: a link is active when
// nvidia-smi gives its speed ("26.562 GB/s"), inactive for "<inactive>"
// or anything without a speed.
func parseNVLinkStatus(s string) []*nvlinkGPU {
	var out []*nvlinkGPU
	var cur *nvlinkGPU
	for _, line := range strings.Split(s, "\n") {
		if m := nvlinkGPURE.FindStringSubmatch(line); m != nil {
			i, _ := strconv.Atoi(m[1])
			cur = &nvlinkGPU{index: i, uuid: m[2]}
			out = append(out, cur)
			continue
		}
		if m := nvlinkLinkRE.FindStringSubmatch(line); m != nil && cur != nil {
			l, _ := strconv.Atoi(m[1])
			if slices.Contains(cur.links, l) {
				continue
			}
			cur.links = append(cur.links, l)
			if strings.HasSuffix(strings.TrimSpace(m[2]), "GB/s") {
				cur.active = append(cur.active, l)
			}
		}
	}
	return out
}

// linkSet names a set of links: "0-17 (18)".
func linkSet(links []int) string {
	if len(links) == 0 {
		return "none"
	}
	l := slices.Clone(links)
	slices.Sort(l)
	var parts []string
	for i := 0; i < len(l); {
		j := i
		for j+1 < len(l) && l[j+1] == l[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, strconv.Itoa(l[i])+"-"+strconv.Itoa(l[j]))
		} else {
			parts = append(parts, strconv.Itoa(l[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",") + " (" + strconv.Itoa(len(l)) + ")"
}

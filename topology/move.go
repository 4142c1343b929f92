package topology

import (
	"cmp"
	"math/bits"
	"slices"
	"strings"
)

// PodHold is one pod's hold on a node's devices, as the kubelet's
// pod-resources API lists it (device plugin devices and DRA claims alike).
type PodHold struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Devices are the device IDs the pod holds: GPU UUIDs, MIG UUIDs,
	// replicas of either ("<uuid>::<n>"); IDs of other resources (RDMA
	// ports) or of devices the node does not have are ignored.
	Devices []string `json:"devices"`
}

// MoveAdvice is what moving a few pods elsewhere would free on a node: the
// smallest set of pods whose removal raises its largest free NVLink block
// to the next size a job could use. It is advice only.
type MoveAdvice struct {
	// BlockNow is the size of the largest free NVLink block now (the
	// gpu_node_agent_largest_free_nvlink_block_gpus gauge).
	BlockNow int
	// BlockIfMoved is the size of the largest free block once Pods moved;
	// BlockNow when there is no advice. It can exceed len(Block) (the
	// pods moved may free more), and is below it when Block is a whole
	// node that is not one NVLink block (a DGX-1's eight GPUs, a PCIe
	// node's).
	BlockIfMoved int
	// Block is the GPU indices (ascending) that would be free as one
	// block once Pods moved; nil when there is no advice. Its size is
	// the target: the next usable block size above BlockNow.
	Block []int
	// Pods are the pods to move, sorted by namespace then name; nil when
	// there is no advice (the node is wholly free, or no move frees a
	// larger usable block).
	Pods []PodHold
	// WholeNode says that once Pods moved (or now, when Pods is nil)
	// every GPU of the node that could serve a whole-GPU pod is free.
	WholeNode bool
}

// AdviseMoves computes MoveAdvice for n. offered says whether the agent
// offers a device (GPU or MIG UUID) to the kubelet; nil means all are.
// holds are the pods holding devices of n. A pure function of its
// arguments: the same arguments, with holds in any order, give the same
// advice.
//
// Eligible GPUs are those that could serve a whole-GPU pod if no pod held
// them: offered, not lost, not in MIG mode. Only they make blocks. A GPU
// in MIG mode never becomes a free whole GPU by moving pods (see
// FreeDevices), so a pod on a MIG device is never suggested for its sake.
//
// A pod holds a GPU when it holds the GPU's UUID, a replica of it
// ("<uuid>::<n>", time-sliced sharing) or one of its MIG devices. Moving a
// pod frees every device it holds; a GPU shared by several pods is free
// only once all of them moved. Holds listed more than once under the same
// namespace and name are one pod (their devices merged, sorted, each
// once).
//
// BlockNow is the largest free NVLink block (FreeDevices with every
// hold's devices allocated). The usable block sizes form a ladder: the
// powers of two below E, the number of eligible GPUs, and E itself. A
// block of size s is usable when its s eligible GPUs are pairwise
// NVLink-connected, or when s == E: the whole node runs an E-GPU job
// even where its GPUs are not one NVLink block (a DGX-1V's hybrid cube
// mesh, a PCIe node). The target is the smallest ladder size above
// BlockNow that some usable block has; E always qualifies, so there is no
// advice only when every eligible GPU is free already (WholeNode, E > 0)
// or there is none (E == 0).
//
// Among the usable blocks of the target size, the advice frees the one
// that needs, in order: the fewest distinct pods holding any of its GPUs;
// then the fewest GPUs held by those pods on the whole node (a GPU counted
// once however many of them hold it, a MIG device counting as its GPU);
// then the lexicographically smallest GPU indices. Pods are those pods and
// BlockIfMoved the largest free NVLink block (FreeDevices) once they moved.
//
// The search extends blocks GPU by GPU in ascending order, pruning blocks
// that already need as much as the best one found; a DGX-2 (16 GPUs, all
// linked, target 8) takes at most C(17,8) = 24310 extensions. It stops at
// maxMoveSearchSteps extensions, which only made-up nodes of about 20 or
// more GPUs reach; the advice is then the best block found so far (moving
// its pods still frees it, but fewer pods might have done), or none if it
// found none. A node of more than 64 eligible GPUs gets no advice.
func AdviseMoves(n *Node, offered func(id string) bool, holds []PodHold) MoveAdvice {
	now := FreeDevices(n, offered, allocatedBy(holds))
	adv := MoveAdvice{BlockNow: len(now.NVLinkBlock), BlockIfMoved: len(now.NVLinkBlock)}
	if n == nil {
		return adv
	}
	if offered == nil {
		offered = func(string) bool { return true }
	}
	el := eligibleGPUs(n, offered)
	if len(el) == 0 {
		return adv
	}
	if now.GPUs == len(el) {
		adv.WholeNode = true
		return adv
	}
	if len(el) > maxMoveGPUs {
		return adv
	}
	pods := holdersOf(n, el, holds)
	omega, _ := largestNVLinkBlock(n, el)
	target := moveTarget(adv.BlockNow, len(el), len(omega))

	var block uint64 // positions in el
	var chosen []int // positions in pods
	if target == len(el) {
		block = uint64(1)<<len(el) - 1 // all ones when len(el) == 64
		for p := range pods {
			chosen = append(chosen, p)
		}
	} else {
		s := newMoveSearch(n, el, pods, target)
		s.extend(s.all)
		if !s.found {
			return adv
		}
		block = s.best
		for p := range pods {
			if pods[p].eligible&block != 0 {
				chosen = append(chosen, p)
			}
		}
	}

	moved := make(map[podKey]bool, len(chosen))
	for _, p := range chosen {
		adv.Pods = append(adv.Pods, pods[p].hold)
		moved[pods[p].key] = true
	}
	var rest []PodHold
	for _, h := range holds {
		if !moved[podKey{h.Namespace, h.Name}] {
			rest = append(rest, h)
		}
	}
	after := FreeDevices(n, offered, allocatedBy(rest))
	adv.BlockIfMoved = len(after.NVLinkBlock)
	adv.WholeNode = after.GPUs == len(el)
	for m := block; m != 0; m &= m - 1 {
		adv.Block = append(adv.Block, el[bits.TrailingZeros64(m)])
	}
	return adv
}

// maxMoveGPUs is the most eligible GPUs AdviseMoves searches (one bit
// each in a uint64).
const maxMoveGPUs = 64

// maxMoveSearchSteps bounds the block search (block extensions). The
// largest real node, a DGX-2 of 16 GPUs on one NVSwitch fabric, needs at
// most 24310 (all 8-GPU blocks and their prefixes); the bound keeps a
// made-up node to a few milliseconds.
const maxMoveSearchSteps = 1 << 17

// eligibleGPUs returns the indices (ascending) of the GPUs that could serve
// a whole-GPU pod if no pod held them: offered, not lost, not in MIG mode,
// as FreeDevices counts a whole GPU free.
func eligibleGPUs(n *Node, offered func(id string) bool) []int {
	var el []int
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.MIGEnabled && !g.Lost && offered(g.UUID) {
			el = append(el, g.Index)
		}
	}
	slices.Sort(el)
	return el
}

// moveTarget is the smallest ladder size above now that a usable block
// has, on a node of e eligible GPUs whose largest NVLink block is omega:
// the smallest power of two above now when it is below e and some block
// has it, else e (the whole node).
func moveTarget(now, e, omega int) int {
	s := 1
	for s <= now {
		s *= 2
	}
	if s < e && s <= omega {
		return s
	}
	return e
}

type podKey struct{ namespace, name string }

// holder is one pod holding eligible GPUs.
type holder struct {
	key  podKey
	hold PodHold
	// eligible is the eligible GPUs it holds, by position in the eligible
	// list (the UUID or a replica of it, as FreeDevices counts them busy).
	eligible uint64
	// gpus are the positions in n.GPUs of every GPU it holds (whole, a
	// replica, or a MIG device of it), ascending, each once.
	gpus []int
}

// holdersOf merges holds by pod and returns the pods that hold an eligible
// GPU, sorted by namespace then name.
func holdersOf(n *Node, el []int, holds []PodHold) []holder {
	pos := make(map[int]int, len(el)) // GPU index → position in el
	for p, idx := range el {
		pos[idx] = p
	}
	gpuAt := make(map[string]int, len(n.GPUs)) // GPU UUID → position in n.GPUs
	migAt := map[string]int{}                  // MIG UUID → its GPU's position
	for i := range n.GPUs {
		gpuAt[n.GPUs[i].UUID] = i
		for _, m := range n.GPUs[i].MIG {
			migAt[m.UUID] = i
		}
	}
	byKey := map[podKey]*holder{}
	listed := map[podKey]int{}
	for _, h := range holds {
		k := podKey{h.Namespace, h.Name}
		p, ok := byKey[k]
		if !ok {
			p = &holder{key: k, hold: PodHold{Namespace: h.Namespace, Name: h.Name}}
			byKey[k] = p
		}
		listed[k]++
		p.hold.Devices = append(p.hold.Devices, h.Devices...)
		for _, id := range h.Devices {
			base, _, _ := strings.Cut(id, "::")
			if i, ok := gpuAt[base]; ok {
				p.gpus = append(p.gpus, i)
				if e, ok := pos[n.GPUs[i].Index]; ok {
					p.eligible |= 1 << e
				}
			} else if i, ok := migAt[base]; ok {
				p.gpus = append(p.gpus, i)
			}
		}
	}
	var out []holder
	for _, p := range byKey {
		if p.eligible == 0 {
			continue
		}
		slices.Sort(p.gpus)
		p.gpus = slices.Compact(p.gpus)
		if listed[p.key] > 1 {
			// Several holds of one pod: merged in an order that does not
			// depend on the order they were listed in.
			slices.Sort(p.hold.Devices)
			p.hold.Devices = slices.Compact(p.hold.Devices)
		}
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b holder) int {
		return cmp.Or(cmp.Compare(a.key.namespace, b.key.namespace), cmp.Compare(a.key.name, b.key.name))
	})
	return out
}

// moveSearch finds, among the NVLink blocks of target eligible GPUs, the
// one whose freeing needs the fewest pods, then the fewest GPUs held by
// them, then comes first in ascending order. Blocks are built by adding
// eligible GPUs in ascending order, so they are met in lexicographic order
// and a later block replaces the best only when strictly cheaper.
type moveSearch struct {
	target int
	all    uint64   // every eligible position
	adj    []uint64 // eligible position → NVLink-connected positions
	podsOn [][]int  // eligible position → holders of it
	gpusOf [][]int  // holder → positions in n.GPUs it holds

	// The block being built and what freeing it takes: how many of its
	// GPUs need each holder, how many needed holders hold each GPU.
	block      uint64
	size       int
	podRef     []int
	gpuRef     []int
	pods, gpus int

	found              bool
	best               uint64
	bestPods, bestGPUs int
	steps              int
}

func newMoveSearch(n *Node, el []int, pods []holder, target int) *moveSearch {
	pos := make(map[int]int, len(el))
	for p, idx := range el {
		pos[idx] = p
	}
	s := &moveSearch{
		target: target,
		adj:    nvlinkAdjacency(n, pos, len(el)),
		podsOn: make([][]int, len(el)),
		gpusOf: make([][]int, len(pods)),
		podRef: make([]int, len(pods)),
		gpuRef: make([]int, len(n.GPUs)),
	}
	for p := range el {
		s.all |= 1 << p
	}
	for i, p := range pods {
		s.gpusOf[i] = p.gpus
		for m := p.eligible; m != 0; m &= m - 1 {
			e := bits.TrailingZeros64(m)
			s.podsOn[e] = append(s.podsOn[e], i)
		}
	}
	return s
}

// extend tries every way to complete the block from cand, the eligible
// positions above the block's last that are linked to all of it.
func (s *moveSearch) extend(cand uint64) {
	need := s.target - s.size
	for m := cand; m != 0 && bits.OnesCount64(m) >= need; {
		if s.steps >= maxMoveSearchSteps {
			return
		}
		s.steps++
		v := bits.TrailingZeros64(m)
		m &^= 1 << v
		s.add(v)
		if !s.found || s.pods < s.bestPods || (s.pods == s.bestPods && s.gpus < s.bestGPUs) {
			if s.size == s.target {
				s.found, s.best, s.bestPods, s.bestGPUs = true, s.block, s.pods, s.gpus
			} else {
				s.extend(m & s.adj[v])
			}
		}
		s.remove(v)
	}
}

// add puts eligible position v in the block, with the holders of it.
func (s *moveSearch) add(v int) {
	s.block |= 1 << v
	s.size++
	for _, p := range s.podsOn[v] {
		if s.podRef[p] == 0 {
			s.pods++
			for _, g := range s.gpusOf[p] {
				if s.gpuRef[g] == 0 {
					s.gpus++
				}
				s.gpuRef[g]++
			}
		}
		s.podRef[p]++
	}
}

// remove undoes add(v).
func (s *moveSearch) remove(v int) {
	s.block &^= 1 << v
	s.size--
	for _, p := range s.podsOn[v] {
		s.podRef[p]--
		if s.podRef[p] == 0 {
			s.pods--
			for _, g := range s.gpusOf[p] {
				s.gpuRef[g]--
				if s.gpuRef[g] == 0 {
					s.gpus--
				}
			}
		}
	}
}

// allocatedBy returns the device IDs holds hold, as FreeDevices takes them.
func allocatedBy(holds []PodHold) map[string]bool {
	m := map[string]bool{}
	for _, h := range holds {
		for _, id := range h.Devices {
			m[id] = true
		}
	}
	return m
}

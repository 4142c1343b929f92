package topology

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
	// BlockNow when there is no advice.
	BlockIfMoved int
	// Block is the GPU indices (ascending) that would be free as one
	// block once Pods moved; nil when there is no advice.
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
// arguments.
func AdviseMoves(n *Node, offered func(id string) bool, holds []PodHold) MoveAdvice {
	// Placeholder until the search lands: no advice.
	f := FreeDevices(n, offered, allocatedBy(holds))
	return MoveAdvice{BlockNow: len(f.NVLinkBlock), BlockIfMoved: len(f.NVLinkBlock)}
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

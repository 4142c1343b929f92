package sim

// A GPU whose initialisation the driver failed (the kernel log's
// "RmInitAdapter failed") stays on the PCI bus, with its sysfs entry, but
// NVML does not list it: nvmlDeviceGetCount counts only the GPUs NVML
// attached, and NVML numbers them in enumeration order, so the GPUs after
// the missing one move down an index. The simulator's own index (Fault.GPU,
// Device(i)) stays what New was given.

// setGPUMissing hides GPU i from NVML (on) or lists it again (off), and
// signals a layout change either way, since the GPUs NVML lists changed.
func (n *Node) setGPUMissing(i int, on bool) {
	n.mu.Lock()
	changed := n.gpus[i].missing != on
	n.gpus[i].missing = on
	n.mu.Unlock()
	if changed {
		n.notifyChanged()
	}
}

// isListed says whether NVML lists GPU i.
func (n *Node) isListed(i int) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return !n.gpus[i].missing
}

// listedCount is how many GPUs NVML lists.
func (n *Node) listedCount() int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	c := 0
	for _, g := range n.gpus {
		if !g.missing {
			c++
		}
	}
	return c
}

// listedIndex is GPU i's NVML index: how many listed GPUs come before it.
func (n *Node) listedIndex(i int) int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	idx := 0
	for _, g := range n.gpus[:i] {
		if !g.missing {
			idx++
		}
	}
	return idx
}

// gpuAtListedIndex finds the GPU at NVML index idx.
func (n *Node) gpuAtListedIndex(idx int) (int, bool) {
	if idx < 0 {
		return 0, false
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	for i, g := range n.gpus {
		if g.missing {
			continue
		}
		if idx == 0 {
			return i, true
		}
		idx--
	}
	return 0, false
}

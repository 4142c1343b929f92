package topology

// GPUByUUID returns the GPU with the given UUID.
func (n *Node) GPUByUUID(uuid string) (*GPU, bool) {
	for i := range n.GPUs {
		if n.GPUs[i].UUID == uuid {
			return &n.GPUs[i], true
		}
	}
	return nil, false
}

// Link returns how GPUs a and b are connected, in either order; the zero
// Link (with A and B set) when the model has no entry for the pair.
func (n *Node) Link(a, b int) Link {
	if a > b {
		a, b = b, a
	}
	for _, l := range n.Links {
		if l.A == a && l.B == b {
			return l
		}
	}
	return Link{A: a, B: b}
}

// MIGParent finds a MIG device by UUID and returns it with its parent GPU.
func (n *Node) MIGParent(migUUID string) (*GPU, *MIGDevice, bool) {
	for i := range n.GPUs {
		for k := range n.GPUs[i].MIG {
			if n.GPUs[i].MIG[k].UUID == migUUID {
				return &n.GPUs[i], &n.GPUs[i].MIG[k], true
			}
		}
	}
	return nil, nil, false
}

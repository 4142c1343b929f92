package sim

// H7 fills this file: RDMA NICs in the simulated host tree
// (/sys/class/infiniband, net devices) for the spec's NICs.
func (n *Node) installNICs() {}

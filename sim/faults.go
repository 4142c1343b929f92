package sim

// H5 fills this file: fault injection (XID events, ECC, lost GPUs, NVLink
// and NIC faults) behind injectFault/clearFault and the mock event set.

import "fmt"

func (n *Node) installFaults() {}

func (n *Node) injectFault(f Fault) error {
	return fmt.Errorf("inject fault: unsupported fault kind %q", f.Kind)
}

func (n *Node) clearFault(f Fault) error {
	return fmt.Errorf("clear fault: unsupported fault kind %q", f.Kind)
}

package topology_test

import (
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// simulate builds a simulated node from spec.
func simulate(t *testing.T, spec *topology.Node) *sim.Node {
	t.Helper()
	n, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatalf("sim.New: %v", err)
	}
	return n
}

// discover reads n back through NVML, as the agent does.
func discover(t *testing.T, n *sim.Node) *topology.Node {
	t.Helper()
	got, err := nvmlowner.Discover(n.NVML(), n.HostRoot(), nil)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return got
}

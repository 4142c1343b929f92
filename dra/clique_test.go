package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestNVLinkCliqueAttribute: every whole GPU of a multi-node NVLink node
// carries the node's gpu.clique value as nvlinkClique; MIG devices, NICs
// and GPUs of a node without the label carry none.
func TestNVLinkCliqueAttribute(t *testing.T) {
	const clique = "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90.7"
	attr := func(d resourceapi.Device) (string, bool) {
		v, ok := d.Attributes[AttrNVLinkClique]
		if !ok || v.StringValue == nil {
			return "", ok
		}
		return *v.StringValue, true
	}
	byType := func(res Result, typ string) []resourceapi.Device {
		var out []resourceapi.Device
		for _, d := range res.Devices {
			if v := d.Attributes[AttrType].StringValue; v != nil && *v == typ {
				out = append(out, d)
			}
		}
		return out
	}

	node, res := buildSim(t, "gb200-nvl72", sim.WithMIG(3, "7g.180gb"))
	if got := topology.Labels(node, "", nil)[topology.LabelGPUClique]; got != clique {
		t.Fatalf("node label gpu.clique=%q, want %q", got, clique)
	}
	gpus := byType(res, TypeGPU)
	if len(gpus) != 3 {
		t.Fatalf("%d whole gpus, want 3 (gpu 3 is in MIG mode)", len(gpus))
	}
	for _, d := range gpus {
		if v, ok := attr(d); !ok || v != clique {
			t.Errorf("%s: nvlinkClique %q (set %t), want %q", d.Name, v, ok, clique)
		}
	}
	migs := byType(res, TypeMIG)
	if len(migs) == 0 {
		t.Fatal("no MIG devices")
	}
	for _, d := range append(migs, byType(res, TypeNIC)...) {
		if v, ok := attr(d); ok {
			t.Errorf("%s: nvlinkClique %q, want none on a MIG device or NIC", d.Name, v)
		}
	}

	// The label's rules: one GPU still registering, or a single-node
	// NVSwitch system, and no GPU has the attribute.
	node.GPUs[1].Fabric = &topology.Fabric{State: topology.FabricInProgress}
	_, h100 := buildSim(t, "dgx-h100")
	for name, res := range map[string]Result{"gb200 gpu 1 registering": mustBuild(t, node), "dgx-h100": h100} {
		for _, d := range byType(res, TypeGPU) {
			if v, ok := attr(d); ok {
				t.Errorf("%s: %s: nvlinkClique %q, want none", name, d.Name, v)
			}
		}
	}
}

func mustBuild(t *testing.T, n *topology.Node) Result {
	t.Helper()
	res, err := Build(n, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

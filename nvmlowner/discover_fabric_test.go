package nvmlowner_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fabricLib answers GetGpuFabricInfo with ret on the GPU with UUID uuid.
type fabricLib struct {
	nvmlowner.Library
	uuid string
	ret  nvml.Return
}

type fabricDev struct {
	nvmlowner.Device
	ret nvml.Return
}

func (d fabricDev) GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return) {
	return nvml.GpuFabricInfo{}, d.ret
}

func (l fabricLib) wrap(d nvmlowner.Device, ret nvml.Return) (nvmlowner.Device, nvml.Return) {
	if ret != nvml.SUCCESS {
		return d, ret
	}
	if u, _ := d.GetUUID(); u == l.uuid {
		return fabricDev{d, l.ret}, ret
	}
	return d, ret
}

func (l fabricLib) DeviceGetHandleByIndex(i int) (nvmlowner.Device, nvml.Return) {
	return l.wrap(l.Library.DeviceGetHandleByIndex(i))
}

func (l fabricLib) DeviceGetHandleByUUID(uuid string) (nvmlowner.Device, nvml.Return) {
	return l.wrap(l.Library.DeviceGetHandleByUUID(uuid))
}

// TestDiscoverFabric: discovery carries each GPU's fabric registration
// into the model, and the gpu.clique label follows topology.Clique's
// rules on a discovered multi-node NVLink node.
func TestDiscoverFabric(t *testing.T) {
	const clique = "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90.7"
	spec, err := sim.Profile("gb200-nvl72")
	if err != nil {
		t.Fatal(err)
	}
	n := simulate(t, spec)
	got := discover(t, n)
	if why := topology.LabelsComplete(got); why != "" {
		t.Fatalf("incomplete: %s", why)
	}
	for i, g := range got.GPUs {
		want := topology.Fabric{State: topology.FabricCompleted, ClusterUUID: "3f2c8a6e-0b41-4d7e-9c15-5e8b7a1c2d90", CliqueID: 7}
		if g.Fabric == nil || *g.Fabric != want {
			t.Errorf("gpu %d fabric %+v, want %+v", i, g.Fabric, want)
		}
	}
	if l := topology.Labels(got, "none", nil)[topology.LabelGPUClique]; l != clique {
		t.Errorf("gpu.clique=%q, want %q", l, clique)
	}

	// One GPU's registration in progress: a complete discovery (the
	// labels are rewritten) without the label.
	if err := n.InjectFault(sim.Fault{Kind: sim.FaultFabricNotReady, GPU: 1}); err != nil {
		t.Fatal(err)
	}
	got = discover(t, n)
	if why := topology.LabelsComplete(got); why != "" {
		t.Fatalf("a fabric registering made discovery incomplete: %s", why)
	}
	if f := got.GPUs[1].Fabric; f == nil || f.State != topology.FabricInProgress || nvml.Return(f.Status) != nvml.ERROR_NOT_READY {
		t.Errorf("gpu 1 fabric %+v, want in progress, not ready", f)
	}
	if l, ok := topology.Labels(got, "none", nil)[topology.LabelGPUClique]; ok {
		t.Errorf("gpu.clique=%q while gpu 1 registers, want none", l)
	}
	if err := n.ClearFault(sim.Fault{Kind: sim.FaultFabricNotReady, GPU: 1}); err != nil {
		t.Fatal(err)
	}
	if l := topology.Labels(discover(t, n), "none", nil)[topology.LabelGPUClique]; l != clique {
		t.Errorf("gpu.clique=%q once registered again, want %q", l, clique)
	}
}

// TestDiscoverFabricReadFails: a fabric read failing other than
// NOT_SUPPORTED makes the discovery incomplete, so the Node keeps its
// labels (gpu.clique included); NOT_SUPPORTED is no fabric; a lost GPU is
// lost.
func TestDiscoverFabricReadFails(t *testing.T) {
	spec, err := sim.Profile("gb200-nvl72")
	if err != nil {
		t.Fatal(err)
	}
	n := simulate(t, spec)
	uuid := spec.GPUs[2].UUID
	tests := []struct {
		ret        nvml.Return
		unread     string // in Node.Unread; "" for none
		lost       bool
		incomplete bool
	}{
		{ret: nvml.ERROR_UNKNOWN, unread: "gpu 2: GetGpuFabricInfo: ", incomplete: true},
		{ret: nvml.ERROR_NOT_SUPPORTED},
		{ret: nvml.ERROR_GPU_IS_LOST, lost: true, incomplete: true},
	}
	for _, tc := range tests {
		t.Run(tc.ret.Error(), func(t *testing.T) {
			got, err := nvmlowner.Discover(fabricLib{n.NVML(), uuid, tc.ret}, n.HostRoot(), nil)
			if err != nil {
				t.Fatal(err)
			}
			g := got.GPUs[2]
			if g.Fabric != nil {
				t.Errorf("gpu 2 fabric %+v after %v, want none", g.Fabric, tc.ret)
			}
			if g.Lost != tc.lost {
				t.Errorf("gpu 2 lost %t, want %t (%s)", g.Lost, tc.lost, g.LostReason)
			}
			unread := strings.Join(got.Unread, "; ")
			if (tc.unread == "") != (unread == "") || !strings.Contains(unread, tc.unread) {
				t.Errorf("unread %q, want %q", unread, tc.unread)
			}
			if why := topology.LabelsComplete(got); (why != "") != tc.incomplete {
				t.Errorf("LabelsComplete = %q, want incomplete %t", why, tc.incomplete)
			}
			if l, ok := topology.Labels(got, "none", nil)[topology.LabelGPUClique]; ok {
				t.Errorf("gpu.clique=%q without gpu 2's fabric", l)
			}
			for i, other := range got.GPUs {
				if i != 2 && (other.Fabric == nil || other.Fabric.ClusterUUID == "") {
					t.Errorf("gpu %d fabric %+v, want its registration", i, other.Fabric)
				}
			}
		})
	}
}

package sim

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestGpuFabricInfo(t *testing.T) {
	// gb200ClusterUUID is the gb200-nvl72 profile's cluster UUID as the
	// 16 bytes NVML returns.
	gb200ClusterUUID := [16]uint8{0x3f, 0x2c, 0x8a, 0x6e, 0x0b, 0x41, 0x4d, 0x7e, 0x9c, 0x15, 0x5e, 0x8b, 0x7a, 0x1c, 0x2d, 0x90}
	tests := []struct {
		profile string
		gpu     int
		want    nvml.Return // of GetGpuFabricInfo
		// cluster and clique are what a registered GPU reports: all zero
		// on a single-node NVSwitch system.
		cluster [16]uint8
		clique  uint32
	}{
		{profile: "dgx-h100", gpu: 4, want: nvml.SUCCESS},
		{profile: "dgx-h200", gpu: 4, want: nvml.SUCCESS},
		{profile: "dgx-b200", gpu: 4, want: nvml.SUCCESS},
		{profile: "gb200-nvl72", gpu: 2, want: nvml.SUCCESS, cluster: gb200ClusterUUID, clique: 7},
		{profile: "dgx-a100", gpu: 4, want: nvml.ERROR_NOT_SUPPORTED},
		{profile: "dgx-2", gpu: 4, want: nvml.ERROR_NOT_SUPPORTED},
		{profile: "pcie-8gpu", gpu: 4, want: nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			n := newTestNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(tc.gpu)
			info, ret := dev.GetGpuFabricInfo()
			if ret != tc.want {
				t.Fatalf("GetGpuFabricInfo: %v, want %v", ret, tc.want)
			}
			body := fmt.Sprintf(`{"kind":"fabric-not-ready","gpu":%d}`, tc.gpu)
			if ret != nvml.SUCCESS {
				if code, msg := fault(t, n, "POST", body); code != http.StatusBadRequest || !strings.Contains(msg, "not on an NVSwitch fabric") {
					t.Errorf("fabric-not-ready off a fabric: %d %q", code, msg)
				}
				return
			}
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_COMPLETED, true)
			if info.ClusterUuid != tc.cluster || info.CliqueId != tc.clique {
				t.Errorf("cluster UUID %x clique %d, want %x and %d", info.ClusterUuid, info.CliqueId, tc.cluster, tc.clique)
			}
			mustFault(t, n, "POST", body)
			info, ret = dev.GetGpuFabricInfo()
			if ret != nvml.SUCCESS {
				t.Fatalf("GetGpuFabricInfo while not ready: %v", ret)
			}
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_IN_PROGRESS, false)
			if info.ClusterUuid != ([16]uint8{}) {
				t.Errorf("cluster UUID %x while registering, want none yet", info.ClusterUuid)
			}
			other, _ := n.NVML().DeviceGetHandleByIndex(tc.gpu + 1)
			if info, _ := other.GetGpuFabricInfo(); info.State != nvml.GPU_FABRIC_STATE_COMPLETED {
				t.Errorf("gpu %d fabric state %d with gpu %d's fault", tc.gpu+1, info.State, tc.gpu)
			}
			mustFault(t, n, "DELETE", body)
			info, _ = dev.GetGpuFabricInfo()
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_COMPLETED, true)
			if info.ClusterUuid != tc.cluster || info.CliqueId != tc.clique {
				t.Errorf("after the fault: cluster UUID %x clique %d, want %x and %d", info.ClusterUuid, info.CliqueId, tc.cluster, tc.clique)
			}
		})
	}
}

// TestGpuFabricInfoFromSnapshot: a snapshot's fabric is what its GPUs
// answer, and a snapshot without one (written before the model carried
// it) gets the single-node registration on an NVSwitch system, which
// Spec then shows.
func TestGpuFabricInfoFromSnapshot(t *testing.T) {
	spec, err := Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for i := range spec.GPUs {
		spec.GPUs[i].Fabric = nil
	}
	spec.GPUs[1].Fabric = &topology.Fabric{State: topology.FabricCompleted, Status: uint32(nvml.ERROR_INSUFFICIENT_RESOURCES), ClusterUUID: "00000000-0000-0000-0000-0000000000a1", CliqueID: 4294967295}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := n.NVML().DeviceGetHandleByIndex(1)
	info, ret := dev.GetGpuFabricInfo()
	if ret != nvml.SUCCESS || nvml.Return(info.Status) != nvml.ERROR_INSUFFICIENT_RESOURCES || info.ClusterUuid != [16]uint8{15: 0xa1} || info.CliqueId != 4294967295 {
		t.Errorf("gpu 1 fabric info %+v %v, want the snapshot's", info, ret)
	}
	got := n.Spec()
	if f := got.GPUs[0].Fabric; f == nil || *f != (topology.Fabric{State: topology.FabricCompleted}) {
		t.Errorf("gpu 0 of a snapshot without fabric: spec fabric %+v, want a completed registration without cluster UUID", f)
	}
	if f := got.GPUs[1].Fabric; f == nil || f.CliqueID != 4294967295 {
		t.Errorf("gpu 1 spec fabric %+v, want the snapshot's", f)
	}
}

// TestSXIDOffNodeSwitches: a multi-node NVLink node has no NVSwitch of
// its own, so no SXid can be logged on it.
func TestSXIDOffNodeSwitches(t *testing.T) {
	n := newTestNode(t, "gb200-nvl72")
	if err := n.InjectFault(Fault{Kind: FaultSXID, XID: 24007}); err == nil || !strings.Contains(err.Error(), "off the node") {
		t.Errorf("sxid on gb200-nvl72: %v, want refused: the switches are off the node", err)
	}
}

func wantFabric(t *testing.T, info nvml.GpuFabricInfo, state uint8, ok bool) {
	t.Helper()
	if info.State != state || (nvml.Return(info.Status) == nvml.SUCCESS) != ok {
		t.Errorf("fabric state %d status %v, want state %d and success %t", info.State, nvml.Return(info.Status), state, ok)
	}
}

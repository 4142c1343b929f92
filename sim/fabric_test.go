package sim

import (
	"net/http"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestGpuFabricInfo(t *testing.T) {
	tests := []struct {
		profile string
		want    nvml.Return // of GetGpuFabricInfo
	}{
		{"dgx-h100", nvml.SUCCESS},
		{"dgx-h200", nvml.SUCCESS},
		{"dgx-b200", nvml.SUCCESS},
		{"dgx-a100", nvml.ERROR_NOT_SUPPORTED},
		{"dgx-2", nvml.ERROR_NOT_SUPPORTED},
		{"pcie-8gpu", nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			n := newTestNode(t, tc.profile)
			dev, _ := n.NVML().DeviceGetHandleByIndex(4)
			info, ret := dev.GetGpuFabricInfo()
			if ret != tc.want {
				t.Fatalf("GetGpuFabricInfo: %v, want %v", ret, tc.want)
			}
			body := `{"kind":"fabric-not-ready","gpu":4}`
			if ret != nvml.SUCCESS {
				if code, msg := fault(t, n, "POST", body); code != http.StatusBadRequest || !strings.Contains(msg, "not on an NVSwitch fabric") {
					t.Errorf("fabric-not-ready off a fabric: %d %q", code, msg)
				}
				return
			}
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_COMPLETED, true)
			mustFault(t, n, "POST", body)
			info, ret = dev.GetGpuFabricInfo()
			if ret != nvml.SUCCESS {
				t.Fatalf("GetGpuFabricInfo while not ready: %v", ret)
			}
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_IN_PROGRESS, false)
			other, _ := n.NVML().DeviceGetHandleByIndex(5)
			if info, _ := other.GetGpuFabricInfo(); info.State != nvml.GPU_FABRIC_STATE_COMPLETED {
				t.Errorf("gpu 5 fabric state %d with gpu 4's fault", info.State)
			}
			mustFault(t, n, "DELETE", body)
			info, _ = dev.GetGpuFabricInfo()
			wantFabric(t, info, nvml.GPU_FABRIC_STATE_COMPLETED, true)
		})
	}
}

func wantFabric(t *testing.T, info nvml.GpuFabricInfo, state uint8, ok bool) {
	t.Helper()
	if info.State != state || (nvml.Return(info.Status) == nvml.SUCCESS) != ok {
		t.Errorf("fabric state %d status %v, want state %d and success %t", info.State, nvml.Return(info.Status), state, ok)
	}
}

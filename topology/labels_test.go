package topology

import (
	"maps"
	"testing"
)

func TestLabels(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		strategy string
		lost     []int
		want     map[string]string
	}{
		{"h100 nvswitch", "dgx-h100", "", nil, map[string]string{
			LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", LabelGPUCount: "8", LabelGPUMemory: "81559",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		}},
		{"dgx-1 direct nvlink is no nvswitch", "dgx1-volta", "", nil, map[string]string{
			LabelGPUProduct: "Tesla-V100-SXM2-16GB", LabelGPUCount: "8", LabelGPUMemory: "16384",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		}},
		{"pcie only", "pcie8", "", nil, map[string]string{
			LabelGPUProduct: "NVIDIA-L40S", LabelGPUCount: "8", LabelGPUMemory: "46068",
			LabelMIGCapable: "false", LabelNVLink: "false", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		}},
		{"lost first gpu: product from the next", "rtx8000x4", "", []int{0}, map[string]string{
			LabelGPUProduct: "Quadro-RTX-8000", LabelGPUCount: "4", LabelGPUMemory: "46080",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x2.1x2",
		}},
		{"mig none", "dgx-a100-mig", "none", nil, map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUCount: "8", LabelGPUMemory: "81920",
			LabelMIGCapable: "true", LabelMIGStrategy: "none", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		}},
		{"mig single overrides gpu labels", "dgx-a100-mig", "single", nil, map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", LabelGPUCount: "8", LabelGPUMemory: "9856",
			LabelMIGCapable: "true", LabelMIGStrategy: "single", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		}},
		{"mig mixed adds per-profile labels", "dgx-a100-mig", "mixed", nil, map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUCount: "8", LabelGPUMemory: "81920",
			LabelMIGCapable: "true", LabelMIGStrategy: "mixed", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
			"nvidia.com/mig-1g.10gb.count": "8", "nvidia.com/mig-1g.10gb.memory": "9856",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := loadSolverNode(t, tc.fixture)
			for _, i := range tc.lost {
				n.GPUs[i].Lost = true
			}
			got := Labels(n, tc.strategy)
			if !maps.Equal(got, tc.want) {
				t.Errorf("Labels =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
	if got := Labels(&Node{}, "mixed"); len(got) != 0 {
		t.Errorf("no GPUs: Labels = %v, want none", got)
	}
}

func TestLabelValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"},
		{"  Quadro  RTX 8000 ", "Quadro-RTX-8000"},
		{"GeForce RTX 4090 (D)", "GeForce-RTX-4090--D"},
		{"(weird)", "weird"},
		{"***", ""},
		{"A123456789B123456789C123456789D123456789E123456789F123456789G123456789", "A123456789B123456789C123456789D123456789E123456789F123456789G12"},
	}
	for _, tc := range tests {
		if got := labelValue(tc.in); got != tc.want {
			t.Errorf("labelValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

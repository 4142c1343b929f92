package topology

import (
	"maps"
	"testing"
)

// base is what Labels sets on a node model without host facts (a
// snapshot fixture): machine unknown, no versions, no vGPU, mode unknown
// (no PCI class), MPS not capable, one replica of each GPU, no sharing.
func base(extra map[string]string) map[string]string {
	l := map[string]string{
		LabelGPUMachine: "unknown", LabelGPUMode: "unknown", LabelMPSCapable: "false",
		LabelGPUReplicas: "1", LabelGPUSharingStrategy: "none",
	}
	maps.Copy(l, extra)
	return l
}

// TestLabels covers the rules on snapshot fixtures; the full GFD label sets
// of discovered simulated nodes are nvmlowner's golden tests.
func TestLabels(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		strategy string
		lost     []int
		want     map[string]string
	}{
		{"h100 nvswitch", "dgx-h100", "", nil, base(map[string]string{
			LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", LabelGPUCount: "8", LabelGPUMemory: "81559",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		})},
		{"dgx-1 direct nvlink is no nvswitch", "dgx1-volta", "", nil, base(map[string]string{
			LabelGPUProduct: "Tesla-V100-SXM2-16GB", LabelGPUCount: "8", LabelGPUMemory: "16384",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		})},
		{"pcie only", "pcie8", "", nil, base(map[string]string{
			LabelGPUProduct: "NVIDIA-L40S", LabelGPUCount: "8", LabelGPUMemory: "46068",
			LabelMIGCapable: "false", LabelNVLink: "false", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		})},
		{"lost first gpu: product from the next", "rtx8000x4", "", []int{0}, base(map[string]string{
			LabelGPUProduct: "Quadro-RTX-8000", LabelGPUCount: "4", LabelGPUMemory: "46080",
			LabelMIGCapable: "false", LabelNVLink: "true", LabelNVSwitch: "false",
			LabelNUMANodes: "2", LabelNUMALayout: "0x2.1x2",
		})},
		{"mig none: no strategy label", "dgx-a100-mig", "none", nil, base(map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUCount: "8", LabelGPUMemory: "81920",
			LabelMIGCapable: "true", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		})},
		{"mig single on a node with MIG off on some GPUs is invalid", "dgx-a100-mig", "single", nil, base(map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB-MIG-INVALID", LabelGPUCount: "0", LabelGPUMemory: "0",
			LabelGPUReplicas: "0", LabelGPUSharingStrategy: "",
			LabelMIGCapable: "true", LabelMIGStrategy: "single", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
		})},
		{"mig mixed adds per-profile labels", "dgx-a100-mig", "mixed", nil, base(map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUCount: "8", LabelGPUMemory: "81920",
			LabelMIGCapable: "true", LabelMIGStrategy: "mixed", LabelNVLink: "true", LabelNVSwitch: "true",
			LabelNUMANodes: "2", LabelNUMALayout: "0x4.1x4",
			"nvidia.com/mig-1g.10gb.count": "8", "nvidia.com/mig-1g.10gb.memory": "9856",
			"nvidia.com/mig-1g.10gb.product":  "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
			"nvidia.com/mig-1g.10gb.replicas": "1", "nvidia.com/mig-1g.10gb.sharing-strategy": "none",
			// The fixture predates the attributes: zero, as GFD prints them.
			"nvidia.com/mig-1g.10gb.multiprocessors": "0", "nvidia.com/mig-1g.10gb.slices.gi": "0",
			"nvidia.com/mig-1g.10gb.slices.ci": "0", "nvidia.com/mig-1g.10gb.engines.copy": "0",
			"nvidia.com/mig-1g.10gb.engines.decoder": "0", "nvidia.com/mig-1g.10gb.engines.encoder": "0",
			"nvidia.com/mig-1g.10gb.engines.jpeg": "0", "nvidia.com/mig-1g.10gb.engines.ofa": "0",
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := loadSolverNode(t, tc.fixture)
			for _, i := range tc.lost {
				n.GPUs[i].Lost = true
			}
			got := Labels(n, tc.strategy, nil)
			if !maps.Equal(got, tc.want) {
				t.Errorf("Labels =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
	if got := Labels(&Node{}, "mixed", nil); len(got) != 0 {
		t.Errorf("no GPUs: Labels = %v, want none", got)
	}
}

// TestHostLabels: the version, machine, mode and vGPU labels by GFD's rules.
func TestHostLabels(t *testing.T) {
	gpu := GPU{UUID: "GPU-1", Model: "NVIDIA L4", PCIClass: PCIClass3DController, ComputeMajor: 8, ComputeMinor: 9}
	tests := []struct {
		name   string
		host   Host
		class  uint32
		want   map[string]string
		absent []string
	}{
		{"two-part driver version has an empty revision", Host{DriverVersion: "550.54", CUDADriverVersion: 12040, MachineType: " PowerEdge R760xa\n"}, 0,
			map[string]string{"nvidia.com/cuda.driver.rev": "", "nvidia.com/cuda.driver-version.revision": "",
				"nvidia.com/cuda.driver-version.full": "550.54", "nvidia.com/cuda.runtime-version.full": "12.4",
				"nvidia.com/cuda.runtime.minor": "4", LabelGPUMachine: "PowerEdge-R760xa", LabelGPUMode: "compute",
				LabelGPUFamily: "ada-lovelace", LabelGPUComputeMajor: "8", LabelGPUComputeMinor: "9"},
			[]string{LabelVGPUPresent, LabelMIGStrategy}},
		{"bad driver version: no version labels", Host{DriverVersion: "550", CUDADriverVersion: 12040}, 0,
			map[string]string{LabelGPUMachine: "unknown"},
			[]string{"nvidia.com/cuda.driver.major", "nvidia.com/cuda.runtime-version.full"}},
		{"display mode and vgpu", Host{VGPU: &VGPU{Present: true, HostDriverVersion: "550.54.16", HostDriverBranch: "r550_00"}}, PCIClassVGA,
			map[string]string{LabelGPUMode: "graphics", LabelVGPUPresent: "true", LabelVGPUHostDriver: "550.54.16", LabelVGPUHostBranch: "r550_00"},
			nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gpu
			if tc.class != 0 {
				g.PCIClass = tc.class
			}
			got := Labels(&Node{GPUs: []GPU{g}, Host: tc.host}, "none", nil)
			for k, v := range tc.want {
				if w, ok := got[k]; !ok || w != v {
					t.Errorf("%s = %q (set %v), want %q", k, w, ok, v)
				}
			}
			for _, k := range tc.absent {
				if v, ok := got[k]; ok {
					t.Errorf("%s = %q, want unset", k, v)
				}
			}
		})
	}
	mixed := Labels(&Node{GPUs: []GPU{gpu, {UUID: "GPU-2", Model: "NVIDIA L4", PCIClass: PCIClassVGA}}}, "", nil)
	if mixed[LabelGPUMode] != "unknown" {
		t.Errorf("gpus of two classes: mode %q, want unknown", mixed[LabelGPUMode])
	}
}

func TestLabelValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"},
		{"  Quadro  RTX 8000 ", "Quadro-RTX-8000"},
		{"GeForce RTX 4090 (D)", "GeForce-RTX-4090-D"}, // GFD drops what it cannot hold
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

// TestSharingLabels: GFD's labels of time-sliced resources
// (k8s-device-plugin internal/lm/resource.go and its resource_test.go
// cases): replicas, sharing-strategy time-slicing and a "-SHARED" product
// unless the replicas are renamed; the count stays the device count.
func TestSharingLabels(t *testing.T) {
	gpuShared := func(replicas int, renamed bool) Sharing {
		return Sharing{gpuResource: {Replicas: replicas, Renamed: renamed}}
	}
	// uniform is two A100s with MIG on, one 1g.5gb device each.
	uniform := func(t *testing.T) *Node {
		return &Node{GPUs: []GPU{
			{Index: 0, UUID: "GPU-0", Model: "NVIDIA A100-SXM4-40GB", MIGCapable: true, MIGEnabled: true, MIG: []MIGDevice{{UUID: "MIG-0", Profile: "1g.5gb", MemoryMiB: 4864}}},
			{Index: 1, UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB", MIGCapable: true, MIGEnabled: true, MIG: []MIGDevice{{UUID: "MIG-1", Profile: "1g.5gb", MemoryMiB: 4864}}},
		}}
	}
	fixture := func(name string) func(*testing.T) *Node {
		return func(t *testing.T) *Node { return loadSolverNode(t, name) }
	}
	tests := []struct {
		name     string
		node     func(*testing.T) *Node
		strategy string
		sharing  Sharing
		want     map[string]string // the labels checked; others must equal the unshared node's
	}{
		{"shared GPUs", fixture("dgx-h100"), "", gpuShared(4, false), map[string]string{
			LabelGPUProduct: "NVIDIA-H100-80GB-HBM3-SHARED", LabelGPUReplicas: "4", LabelGPUSharingStrategy: "time-slicing", LabelGPUCount: "8"}},
		{"renamed replicas keep the product", fixture("dgx-h100"), "", gpuShared(10, true), map[string]string{
			LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", LabelGPUReplicas: "10", LabelGPUSharingStrategy: "time-slicing", LabelGPUCount: "8"}},
		{"another resource shared: GPUs unchanged", fixture("dgx-h100"), "", Sharing{"nvidia.com/mig-1g.10gb": {Replicas: 2}}, map[string]string{
			LabelGPUProduct: "NVIDIA-H100-80GB-HBM3", LabelGPUReplicas: "1", LabelGPUSharingStrategy: "none"}},
		{"a MIG profile shared under mixed", fixture("dgx-a100-mig"), "mixed", Sharing{"nvidia.com/mig-1g.10gb": {Replicas: 3}}, map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-80GB", LabelGPUReplicas: "1", LabelGPUSharingStrategy: "none",
			"nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED", "nvidia.com/mig-1g.10gb.replicas": "3",
			"nvidia.com/mig-1g.10gb.sharing-strategy": "time-slicing", "nvidia.com/mig-1g.10gb.count": "8"}},
		{"MIG devices shared under single (the README's A100-SXM4-40GB-MIG-1g.5gb-SHARED)", uniform, "single", gpuShared(2, false), map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", LabelGPUReplicas: "2", LabelGPUSharingStrategy: "time-slicing", LabelGPUCount: "2"}},
		{"GPUs all MIG-enabled under none are labelled without sharing", uniform, "none", gpuShared(2, false), map[string]string{
			LabelGPUProduct: "NVIDIA-A100-SXM4-40GB", LabelGPUReplicas: "0", LabelGPUSharingStrategy: "none", LabelGPUCount: "2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Labels(tc.node(t), tc.strategy, tc.sharing)
			want := Labels(tc.node(t), tc.strategy, nil)
			maps.Copy(want, tc.want)
			if !maps.Equal(got, want) {
				for k, v := range want {
					if got[k] != v {
						t.Errorf("%s = %q, want %q", k, got[k], v)
					}
				}
				for k, v := range got {
					if _, ok := want[k]; !ok {
						t.Errorf("unexpected %s = %q", k, v)
					}
				}
			}
		})
	}
}

package sim

import (
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestGPUMissing(t *testing.T) {
	tests := []struct {
		name    string
		missing []int
		// want are the simulator indexes of the GPUs NVML lists, in
		// NVML index order.
		want []int
	}{
		{"first", []int{0}, []int{1, 2, 3, 4, 5, 6, 7}},
		{"middle", []int{2}, []int{0, 1, 3, 4, 5, 6, 7}},
		{"last", []int{7}, []int{0, 1, 2, 3, 4, 5, 6}},
		{"two", []int{1, 5}, []int{0, 2, 3, 4, 6, 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newFaultNode(t)
			lib := n.NVML()
			full := n.Spec()
			for _, i := range tc.missing {
				mustFault(t, n, "POST", `{"kind":"gpu-missing","gpu":`+strconv.Itoa(i)+`}`)
			}
			select {
			case <-n.Changed():
			default:
				t.Error("Changed not signalled by gpu-missing")
			}
			if c, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS || c != len(tc.want) {
				t.Fatalf("DeviceGetCount = %d, %v; want %d", c, ret, len(tc.want))
			}
			for idx, i := range tc.want {
				d, ret := lib.DeviceGetHandleByIndex(idx)
				if ret != nvml.SUCCESS {
					t.Fatalf("DeviceGetHandleByIndex(%d): %v", idx, ret)
				}
				if u, _ := d.GetUUID(); u != full.GPUs[i].UUID {
					t.Errorf("NVML index %d is %s, want gpu %d (%s)", idx, u, i, full.GPUs[i].UUID)
				}
				if got, ret := mockOf(d).GetIndex(); ret != nvml.SUCCESS || got != idx {
					t.Errorf("gpu %d GetIndex = %d, %v; want %d", i, got, ret, idx)
				}
			}
			if _, ret := lib.DeviceGetHandleByIndex(len(tc.want)); ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Errorf("DeviceGetHandleByIndex(%d) past the listed gpus: %v", len(tc.want), ret)
			}
			spec := n.Spec()
			if len(spec.GPUs) != len(tc.want) {
				t.Fatalf("Spec lists %d gpus, want %d", len(spec.GPUs), len(tc.want))
			}
			for idx, i := range tc.want {
				if g := spec.GPUs[idx]; g.UUID != full.GPUs[i].UUID || g.Index != idx {
					t.Errorf("Spec gpu %d: %s index %d, want %s", idx, g.UUID, g.Index, full.GPUs[i].UUID)
				}
			}
			for _, l := range spec.Links {
				if l.A >= len(tc.want) || l.B >= len(tc.want) || l.A >= l.B {
					t.Errorf("Spec link %d-%d does not fit %d gpus", l.A, l.B, len(tc.want))
				}
			}
			for _, nic := range spec.NICs {
				for _, d := range nic.GPUs {
					if d.GPU >= len(tc.want) {
						t.Errorf("nic %s distance to gpu %d of %d", nic.Name, d.GPU, len(tc.want))
					}
				}
			}
			for _, i := range tc.missing {
				g := full.GPUs[i]
				if _, ret := lib.DeviceGetHandleByUUID(g.UUID); ret != nvml.ERROR_NOT_FOUND {
					t.Errorf("DeviceGetHandleByUUID of missing gpu %d: %v, want NOT_FOUND", i, ret)
				}
				// Still on the PCI bus: an NVIDIA 3D controller.
				dir := filepath.Join(n.HostRoot(), "sys", "bus", "pci", "devices", g.PCIBusID)
				vendor, err := os.ReadFile(filepath.Join(dir, "vendor"))
				class, err2 := os.ReadFile(filepath.Join(dir, "class"))
				if err != nil || err2 != nil || strings.TrimSpace(string(vendor)) != "0x10de" || !strings.HasPrefix(string(class), "0x0302") {
					t.Errorf("missing gpu %d in sysfs: vendor %q (%v), class %q (%v)", i, vendor, err, class, err2)
				}
			}

			for _, i := range tc.missing {
				mustFault(t, n, "DELETE", `{"kind":"gpu-missing","gpu":`+strconv.Itoa(i)+`}`)
			}
			select {
			case <-n.Changed():
			default:
				t.Error("Changed not signalled by clearing gpu-missing")
			}
			if c, _ := lib.DeviceGetCount(); c != len(full.GPUs) {
				t.Errorf("DeviceGetCount after clearing = %d, want %d", c, len(full.GPUs))
			}
			for i, g := range full.GPUs {
				d, _ := lib.DeviceGetHandleByUUID(g.UUID)
				if idx, ret := mockOf(d).GetIndex(); ret != nvml.SUCCESS || idx != i {
					t.Errorf("gpu %d index after clearing: %d, %v", i, idx, ret)
				}
			}
			if !reflect.DeepEqual(n.Spec(), full) {
				t.Error("Spec after clearing differs from before")
			}
		})
	}
}

// TestGPUMissingMIG: the MIG devices of a GPU NVML does not list are not
// found either.
func TestGPUMissingMIG(t *testing.T) {
	n := newFaultNode(t, WithMIG(3, "3g.40gb", "3g.40gb"))
	mig := n.Spec().GPUs[3].MIG[1].UUID
	mustFault(t, n, "POST", `{"kind":"gpu-missing","gpu":3}`)
	if _, ret := n.NVML().DeviceGetHandleByUUID(mig); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("MIG device of a missing gpu: %v, want NOT_FOUND", ret)
	}
}

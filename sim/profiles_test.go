package sim

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestEveryProfileBuilds(t *testing.T) {
	for _, name := range Profiles() {
		t.Run(name, func(t *testing.T) {
			spec, err := Profile(name)
			if err != nil {
				t.Fatalf("Profile(%q): %v", name, err)
			}
			n, err := New(spec, t.TempDir(), nil)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			lib := n.NVML()
			count, ret := lib.DeviceGetCount()
			if ret != nvml.SUCCESS || count != len(spec.GPUs) {
				t.Fatalf("DeviceGetCount = %d, %v; want %d", count, ret, len(spec.GPUs))
			}
			for i := 0; i < count; i++ {
				d, ret := lib.DeviceGetHandleByIndex(i)
				if ret != nvml.SUCCESS {
					t.Fatalf("handle %d: %v", i, ret)
				}
				uuid, _ := d.GetUUID()
				if uuid != spec.GPUs[i].UUID {
					t.Errorf("gpu %d uuid %s, want %s", i, uuid, spec.GPUs[i].UUID)
				}
				// Anything the simulator does not model answers "not supported"
				// instead of panicking.
				if _, ret := mockOf(d).GetBoardPartNumber(); ret != nvml.ERROR_NOT_SUPPORTED {
					t.Errorf("GetBoardPartNumber = %v, want ERROR_NOT_SUPPORTED", ret)
				}
			}
		})
	}
}

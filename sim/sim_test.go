package sim

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

var update = flag.Bool("update", false, "rewrite topology/testdata/profiles from the profiles")

var uuidPattern = regexp.MustCompile(`^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestProfileUUIDsDeterministic(t *testing.T) {
	seen := map[string]string{}
	for _, name := range Profiles() {
		a, err := Profile(name, withMIGIfCapable(name)...)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := Profile(name, withMIGIfCapable(name)...)
		for i, g := range a.GPUs {
			if g.UUID != b.GPUs[i].UUID {
				t.Errorf("%s gpu %d: uuid changed between calls", name, i)
			}
			if !uuidPattern.MatchString(g.UUID) {
				t.Errorf("%s gpu %d: uuid %q is not GPU-8-4-4-4-12 hex", name, i, g.UUID)
			}
			if prev, dup := seen[g.UUID]; dup {
				t.Errorf("%s gpu %d: uuid also used by %s", name, i, prev)
			}
			seen[g.UUID] = name
			for k, m := range g.MIG {
				if m.UUID != b.GPUs[i].MIG[k].UUID || !uuidPattern.MatchString(m.UUID) {
					t.Errorf("%s gpu %d mig %d: uuid %q not deterministic or malformed", name, i, k, m.UUID)
				}
			}
		}
	}
}

// withMIGIfCapable gives MIG-capable profiles one MIG GPU so UUID checks
// cover MIG devices too.
func withMIGIfCapable(name string) []ProfileOption {
	switch name {
	case "dgx-a100":
		return []ProfileOption{WithMIG(0, "3g.20gb", "3g.20gb")}
	case "dgx-h100", "pcie-8gpu":
		return []ProfileOption{WithMIG(0, "3g.40gb", "3g.40gb")}
	}
	return nil
}

func TestWithMIGValidation(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		opts    []ProfileOption
		want    string
	}{
		{"unknown profile name", "dgx-h100", []ProfileOption{WithMIG(0, "1g.5gb")}, `mig profile "1g.5gb" is not offered by NVIDIA H100 80GB HBM3`},
		{"too many instances", "dgx-a100", []ProfileOption{WithMIG(0, "3g.20gb", "3g.20gb", "3g.20gb")}, "at most 2 instances"},
		{"slices do not fit", "dgx-h100", []ProfileOption{WithMIG(1, "4g.40gb", "3g.40gb", "1g.10gb")}, "does not fit"},
		{"gpu without MIG", "dgx-1v", []ProfileOption{WithMIG(0, "1g.5gb")}, "does not support MIG"},
		{"gpu out of range", "dgx-h100", []ProfileOption{WithMIG(8, "7g.80gb")}, "gpu 8: no such gpu"},
		{"same gpu twice", "dgx-h100", []ProfileOption{WithMIG(0, "7g.80gb"), WithMIG(0, "7g.80gb")}, "given twice"},
		{"unknown profile", "dgx-9000", nil, `unknown simulator profile "dgx-9000"`},
		{"full a100", "dgx-a100", []ProfileOption{WithMIG(0, "4g.20gb", "2g.10gb", "1g.5gb")}, ""},
		{"seven 1g on h100", "dgx-h100", []ProfileOption{WithMIG(0, "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Profile(tc.profile, tc.opts...)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("valid layout refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestHostTree(t *testing.T) {
	n := newTestNode(t, "dgx-a100", WithMIG(2, "3g.20gb", "3g.20gb"))
	root := n.HostRoot()
	spec := n.Spec()
	for _, g := range spec.GPUs {
		dev := filepath.Join(root, "sys", "bus", "pci", "devices", g.PCIBusID)
		target, err := filepath.EvalSymlinks(dev)
		if err != nil {
			t.Fatalf("gpu %d: %v", g.Index, err)
		}
		wantDir := filepath.Join(append([]string{root, "sys", "devices", "pci" + g.PCIPath[0][:7]}, g.PCIPath...)...)
		if resolved, _ := filepath.EvalSymlinks(wantDir); target != resolved {
			t.Errorf("gpu %d: %s -> %s, want %s", g.Index, dev, target, wantDir)
		}
		for file, want := range map[string]string{"numa_node": itoa(g.NUMANode), "vendor": "0x10de", "class": "0x030200", "device": "0x20b0"} {
			data, err := os.ReadFile(filepath.Join(dev, file))
			if err != nil || strings.TrimSpace(string(data)) != want {
				t.Errorf("gpu %d %s = %q (%v), want %q", g.Index, file, data, err, want)
			}
		}
		// Every bridge on the path is a PCI device too.
		for _, hop := range g.PCIPath[:len(g.PCIPath)-1] {
			data, err := os.ReadFile(filepath.Join(root, "sys", "bus", "pci", "devices", hop, "class"))
			if err != nil || strings.TrimSpace(string(data)) != "0x060400" {
				t.Errorf("bridge %s class %q (%v), want 0x060400", hop, data, err)
			}
		}
		if _, err := os.Stat(filepath.Join(root, "dev", "nvidia"+itoa(g.Minor))); err != nil {
			t.Errorf("gpu %d: %v", g.Index, err)
		}
	}
	for _, name := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1", "nvidia-caps/nvidia-cap2"} {
		if _, err := os.Stat(filepath.Join(root, "dev", name)); err != nil {
			t.Errorf("/dev/%s: %v", name, err)
		}
	}
	// MIG capability files as the NVIDIA plugin reads them.
	m := spec.GPUs[2].MIG[0]
	access := filepath.Join(root, "proc", "driver", "nvidia", "capabilities", "gpu2", "mig", "gi"+itoa(m.GPUInstance), "access")
	data, err := os.ReadFile(access)
	wantMinor := 3 + 2*135 + m.GPUInstance*9
	if err != nil || !strings.Contains(string(data), "DeviceFileMinor: "+itoa(wantMinor)) {
		t.Errorf("%s = %q (%v), want minor %d", access, data, err, wantMinor)
	}
	minors, err := os.ReadFile(filepath.Join(root, "proc", "driver", "nvidia-caps", "mig-minors"))
	if err != nil || !strings.Contains(string(minors), "gpu31/gi14/ci7/access 4322\n") {
		t.Errorf("mig-minors does not follow the driver's numbering (%v)", err)
	}
}

func TestSetMIGLayoutErrors(t *testing.T) {
	n := newTestNode(t, "dgx-1v")
	if err := n.SetMIGLayout(0, []string{"1g.5gb"}); err == nil || !strings.Contains(err.Error(), "does not support MIG") {
		t.Errorf("MIG on a V100: %v", err)
	}
	if err := n.SetMIGLayout(9, nil); err == nil || !strings.Contains(err.Error(), "gpu 9") {
		t.Errorf("MIG on gpu 9: %v", err)
	}
	h := newTestNode(t, "dgx-h100", WithMIG(0, "7g.80gb"))
	before := h.Spec().GPUs[0].MIG
	if err := h.SetMIGLayout(0, []string{"7g.80gb", "1g.10gb"}); err == nil {
		t.Fatal("an impossible layout was applied")
	}
	if after := h.Spec().GPUs[0].MIG; len(after) != 1 || after[0].UUID != before[0].UUID {
		t.Errorf("a refused layout changed the GPU: %+v", after)
	}
	select {
	case <-h.Changed():
		t.Error("Changed signalled for a refused layout")
	default:
	}
}

func TestLostGPUAndLinkState(t *testing.T) {
	n := newTestNode(t, "dgx-h100")
	d, _ := n.NVML().DeviceGetHandleByIndex(2)
	if err := n.setGPULost(2, true); err != nil {
		t.Fatal(err)
	}
	if _, ret := d.GetMemoryInfo(); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("GetMemoryInfo on a lost gpu = %v", ret)
	}
	if uuid, ret := d.GetUUID(); ret != nvml.SUCCESS || uuid != n.Spec().GPUs[2].UUID {
		t.Errorf("GetUUID on a lost gpu = %q, %v; identity must stay readable", uuid, ret)
	}
	if err := n.setGPULost(2, false); err != nil {
		t.Fatal(err)
	}
	if _, ret := d.GetMemoryInfo(); ret != nvml.SUCCESS {
		t.Errorf("GetMemoryInfo after recovery = %v", ret)
	}
	if err := n.setNVLinkDown(2, 17, true); err != nil {
		t.Fatal(err)
	}
	if st, ret := d.GetNvLinkState(17); ret != nvml.SUCCESS || st != nvml.FEATURE_DISABLED {
		t.Errorf("link 17 after down = %v, %v", st, ret)
	}
	if err := n.setNVLinkDown(2, 18, true); err == nil {
		t.Error("link 18 of an 18-link GPU accepted")
	}
	if _, ret := d.GetNvLinkState(18); ret != nvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("GetNvLinkState(18) = %v, want ERROR_INVALID_ARGUMENT", ret)
	}
}

// TestConcurrentMIGChanges races NVML readers against layout changes; run
// with -race.
func TestConcurrentMIGChanges(t *testing.T) {
	n := newTestNode(t, "dgx-h100", WithMIG(0, "7g.80gb"))
	lib := n.NVML()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, _ := lib.DeviceGetHandleByIndex(0)
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _, _ = d.GetMigMode()
				for i := 0; i < 7; i++ {
					m, ret := d.GetMigDeviceHandleByIndex(i)
					if ret != nvml.SUCCESS {
						continue
					}
					uuid, _ := m.GetUUID()
					if _, ret := lib.DeviceGetHandleByUUID(uuid); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
						t.Errorf("DeviceGetHandleByUUID(%s) = %v", uuid, ret)
					}
					_, _ = m.GetAttributes()
				}
				_ = n.Spec()
			}
		}()
	}
	layouts := [][]string{{"3g.40gb", "3g.40gb"}, nil, {"1g.10gb", "2g.20gb", "4g.40gb"}, {"7g.80gb"}}
	for i := 0; i < 40; i++ {
		if err := n.SetMIGLayout(0, layouts[i%len(layouts)]); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if got := n.Spec().GPUs[0].MIG; len(got) != 1 || got[0].Profile != "7g.80gb" {
		t.Errorf("final layout %+v, want one 7g.80gb", got)
	}
}

// TestProfileFixtures keeps topology/testdata/profiles/<name>.json equal to
// the profiles (go test ./sim -run TestProfileFixtures -update rewrites
// them). They are snapshots for `--simulate FILE` and for other packages'
// tests.
func TestProfileFixtures(t *testing.T) {
	dir := filepath.Join("..", "topology", "testdata", "profiles")
	for _, name := range Profiles() {
		spec, err := Profile(name)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := topology.WriteSnapshot(&b, spec); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name+".json")
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test ./sim -run TestProfileFixtures -update)", err)
		}
		if !bytes.Equal(have, b.Bytes()) {
			t.Errorf("%s is out of date (run go test ./sim -run TestProfileFixtures -update)", path)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestMIGInstancesConsistent checks that the GPU and compute instances NVML
// lists agree with the MIG devices, as tools like mig-parted and dcgm
// expect.
func TestMIGInstancesConsistent(t *testing.T) {
	n := newTestNode(t, "dgx-a100", WithMIG(1, "1g.5gb", "1g.5gb+me", "2g.10gb", "3g.20gb"))
	d, _ := n.NVML().DeviceGetHandleByIndex(1)
	count, ret := d.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS || count != 7 {
		t.Fatalf("GetMaxMigDeviceCount = %d, %v; want 7", count, ret)
	}
	listed := 0
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := d.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := mockOf(d).GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstances(profile %d) = %v", id, ret)
		}
		listed += len(gis)
	}
	if listed != 4 {
		t.Errorf("GetGpuInstances over all profiles listed %d instances, want 4", listed)
	}
	for i := 0; i < 4; i++ {
		m, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatalf("mig %d: %v", i, ret)
		}
		if isMIG, _ := mockOf(m).IsMigDeviceHandle(); !isMIG {
			t.Errorf("mig %d: IsMigDeviceHandle false", i)
		}
		if parent, ret := mockOf(m).GetDeviceHandleFromMigDeviceHandle(); ret != nvml.SUCCESS || parent != nvml.Device(mockOf(d)) {
			t.Errorf("mig %d: parent handle %v, %v", i, parent, ret)
		}
		giID, _ := m.GetGpuInstanceId()
		ciID, _ := m.GetComputeInstanceId()
		gi, ret := d.GetGpuInstanceById(giID)
		if ret != nvml.SUCCESS {
			t.Fatalf("mig %d: GetGpuInstanceById(%d) = %v", i, giID, ret)
		}
		giInfo, _ := gi.GetInfo()
		profile, _ := d.GetGpuInstanceProfileInfo(int(giInfo.ProfileId))
		attrs, _ := m.GetAttributes()
		if profile.SliceCount != attrs.GpuInstanceSliceCount || profile.MemorySizeMB != attrs.MemorySizeMB {
			t.Errorf("mig %d: gi profile %d slices/%d MiB, attributes %d/%d", i, profile.SliceCount, profile.MemorySizeMB, attrs.GpuInstanceSliceCount, attrs.MemorySizeMB)
		}
		ci, ret := gi.GetComputeInstanceById(ciID)
		if ret != nvml.SUCCESS {
			t.Fatalf("mig %d: GetComputeInstanceById(%d) = %v", i, ciID, ret)
		}
		ciInfo, _ := ci.GetInfo()
		if int(ciInfo.Id) != ciID || ciInfo.GpuInstance != gi || ciInfo.Device != m {
			t.Errorf("mig %d: compute instance info %+v", i, ciInfo)
		}
		mem, _ := m.GetMemoryInfo()
		if mem.Total != attrs.MemorySizeMB<<20 {
			t.Errorf("mig %d: memory %d, want %d MiB", i, mem.Total>>20, attrs.MemorySizeMB)
		}
	}
	if _, ret := d.GetMigDeviceHandleByIndex(4); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("GetMigDeviceHandleByIndex(4) = %v, want ERROR_NOT_FOUND", ret)
	}
	if _, ret := mockOf(d).CreateGpuInstance(&nvml.GpuInstanceProfileInfo{}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("CreateGpuInstance = %v; instances are made with a placement only", ret)
	}
}

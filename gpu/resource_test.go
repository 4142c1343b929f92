package gpu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

const (
	gpu2UUID = "GPU-00000002-0000-0000-0000-000000000000"
	gpu5UUID = "GPU-00000005-0000-0000-0000-000000000000"
	// mig3g is the 3g.40gb device on GPU 0 (GI 2, CI 0); mig1g the first
	// 1g.10gb on GPU 0 (GI 9, CI 0).
	mig3g = "MIG-00000000-0000-0000-0000-000000000000"
	mig1g = "MIG-00000000-0001-0000-0000-000000000000"
)

// hostRoot builds a host root holding the given files (device nodes are
// plain files: only their existence matters) and optional mig-minors text.
func hostRoot(t *testing.T, migMinors string, files ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if migMinors != "" {
		p := filepath.Join(root, migMinorsPath)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(migMinors), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func findResource(t *testing.T, rs []plugin.Resource, name string) plugin.Resource {
	t.Helper()
	for _, r := range rs {
		if r.Name() == name {
			return r
		}
	}
	t.Fatalf("resource %s not found", name)
	return nil
}

func specPaths(specs []*pluginapi.DeviceSpec) []string {
	var out []string
	for _, s := range specs {
		if s.HostPath != s.ContainerPath || s.Permissions != "rw" {
			out = append(out, "BAD:"+s.HostPath+"->"+s.ContainerPath+":"+s.Permissions)
			continue
		}
		out = append(out, s.ContainerPath)
	}
	return out
}

func TestAllocate(t *testing.T) {
	const minors = "config 1\nmonitor 2\ngpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\ngpu0/gi9/access 84\ngpu0/gi9/ci0/access 85\n"
	fullRoot := func(t *testing.T) string {
		return hostRoot(t, minors,
			"dev/nvidia0", "dev/nvidia2", "dev/nvidia5", "dev/nvidiactl", "dev/nvidia-uvm",
			"dev/nvidia-caps/nvidia-cap21", "dev/nvidia-caps/nvidia-cap22", "dev/nvidia-caps/nvidia-cap84", "dev/nvidia-caps/nvidia-cap85")
	}
	tests := []struct {
		name       string
		cfg        Config
		root       func(*testing.T) string
		resource   string
		ids        []string
		wantEnv    map[string]string
		wantMounts []string
		wantCDI    []string
		wantSpecs  []string
		wantCode   codes.Code
		wantErrHas []string // substrings of the error message
	}{
		{
			name: "envvar by default", resource: ResourceGPU, ids: []string{gpu2UUID, gpu5UUID},
			wantEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": gpu2UUID + "," + gpu5UUID},
		},
		{
			name: "volume-mounts", cfg: Config{DeviceListStrategy: DeviceListVolumeMounts}, resource: ResourceGPU, ids: []string{gpu2UUID},
			wantEnv:    map[string]string{"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"},
			wantMounts: []string{"/dev/null->/var/run/nvidia-container-devices/" + gpu2UUID},
		},
		{
			name: "cdi-cri has CDI names and no env", cfg: Config{DeviceListStrategy: DeviceListCDICRI}, resource: ResourceGPU, ids: []string{gpu5UUID, gpu2UUID},
			wantCDI: []string{"nvidia.com/gpu=" + gpu5UUID, "nvidia.com/gpu=" + gpu2UUID},
		},
		{
			name: "cdi-cri MIG device", cfg: Config{DeviceListStrategy: DeviceListCDICRI}, resource: "nvidia.com/mig-3g.40gb", ids: []string{mig3g},
			wantCDI: []string{"nvidia.com/gpu=" + mig3g},
		},
		{
			name: "device specs for whole GPUs: only nodes that exist", cfg: Config{PassDeviceSpecs: true}, root: fullRoot, resource: ResourceGPU, ids: []string{gpu2UUID, gpu5UUID},
			wantEnv:   map[string]string{"NVIDIA_VISIBLE_DEVICES": gpu2UUID + "," + gpu5UUID},
			wantSpecs: []string{"/dev/nvidia2", "/dev/nvidia5", "/dev/nvidiactl", "/dev/nvidia-uvm"},
		},
		{
			name: "device specs for MIG: parent and capability nodes", cfg: Config{PassDeviceSpecs: true}, root: fullRoot, resource: "nvidia.com/mig-3g.40gb", ids: []string{mig3g},
			wantEnv:   map[string]string{"NVIDIA_VISIBLE_DEVICES": mig3g},
			wantSpecs: []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22", "/dev/nvidiactl", "/dev/nvidia-uvm"},
		},
		{
			name: "device specs for two MIG devices share the parent node once", cfg: Config{PassDeviceSpecs: true, MIGStrategy: MIGStrategySingle}, root: fullRoot, resource: ResourceGPU, ids: []string{mig3g, mig1g},
			wantEnv:   map[string]string{"NVIDIA_VISIBLE_DEVICES": mig3g + "," + mig1g},
			wantSpecs: []string{"/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22", "/dev/nvidia-caps/nvidia-cap84", "/dev/nvidia-caps/nvidia-cap85", "/dev/nvidiactl", "/dev/nvidia-uvm"},
		},
		{
			name: "MIG device specs without mig-minors fail", cfg: Config{PassDeviceSpecs: true}, root: func(t *testing.T) string { return hostRoot(t, "", "dev/nvidia0") },
			resource: "nvidia.com/mig-3g.40gb", ids: []string{mig3g}, wantCode: codes.FailedPrecondition,
		},
		{
			name: "device specs without the GPU's own node fail", cfg: Config{PassDeviceSpecs: true},
			root: func(t *testing.T) string {
				return hostRoot(t, "", "dev/nvidia5", "dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools")
			},
			resource: ResourceGPU, ids: []string{gpu5UUID, gpu2UUID}, wantCode: codes.FailedPrecondition,
			wantErrHas: []string{gpu2UUID, "/dev/nvidia2"},
		},
		{
			name: "device specs without the MIG parent's node fail", cfg: Config{PassDeviceSpecs: true},
			root: func(t *testing.T) string {
				return hostRoot(t, minors, "dev/nvidiactl", "dev/nvidia-caps/nvidia-cap21", "dev/nvidia-caps/nvidia-cap22")
			},
			resource: "nvidia.com/mig-3g.40gb", ids: []string{mig3g}, wantCode: codes.FailedPrecondition,
			wantErrHas: []string{mig3g, "/dev/nvidia0"},
		},
		{
			name: "device specs without a MIG capability node fail", cfg: Config{PassDeviceSpecs: true},
			root: func(t *testing.T) string {
				return hostRoot(t, minors, "dev/nvidia0", "dev/nvidiactl", "dev/nvidia-caps/nvidia-cap21")
			},
			resource: "nvidia.com/mig-3g.40gb", ids: []string{mig3g}, wantCode: codes.FailedPrecondition,
			wantErrHas: []string{mig3g, "/dev/nvidia-caps/nvidia-cap22"},
		},
		{
			name: "device specs without any control node still allocate", cfg: Config{PassDeviceSpecs: true},
			root:     func(t *testing.T) string { return hostRoot(t, "", "dev/nvidia2") },
			resource: ResourceGPU, ids: []string{gpu2UUID},
			wantEnv:   map[string]string{"NVIDIA_VISIBLE_DEVICES": gpu2UUID},
			wantSpecs: []string{"/dev/nvidia2"},
		},
		{
			name: "unknown ID is invalid argument", resource: ResourceGPU, ids: []string{"GPU-nope"}, wantCode: codes.InvalidArgument,
		},
		{
			name: "MIG ID on the whole-GPU resource is invalid argument", resource: ResourceGPU, ids: []string{mig3g}, wantCode: codes.InvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg.MIGStrategy == "" {
				cfg.MIGStrategy = MIGStrategyMixed
			}
			node := loadNode(t, "h100-mig-mixed.json")
			if cfg.MIGStrategy == MIGStrategySingle {
				node = loadNode(t, "h100-mig-mixed.json")
				node.GPUs = node.GPUs[:1]
				for i := range node.GPUs[0].MIG {
					node.GPUs[0].MIG[i].Profile = "1g.10gb"
				}
			}
			if tc.root != nil {
				cfg.HostRoot = tc.root(t)
			} else {
				cfg.HostRoot = hostRoot(t, "")
			}
			rs, err := Resources(node, cfg, healthMap{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := findResource(t, rs, tc.resource).Allocate(context.Background(), tc.ids)
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode {
					t.Fatalf("error = %v, want code %v", err, tc.wantCode)
				}
				for _, s := range tc.wantErrHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %s", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Envs) != len(tc.wantEnv) {
				t.Errorf("envs = %v, want %v", resp.Envs, tc.wantEnv)
			}
			for k, v := range tc.wantEnv {
				if resp.Envs[k] != v {
					t.Errorf("env %s = %q, want %q", k, resp.Envs[k], v)
				}
			}
			var mounts []string
			for _, m := range resp.Mounts {
				mounts = append(mounts, m.HostPath+"->"+m.ContainerPath)
			}
			if !slices.Equal(mounts, tc.wantMounts) {
				t.Errorf("mounts = %v, want %v", mounts, tc.wantMounts)
			}
			var cdi []string
			for _, d := range resp.CdiDevices {
				cdi = append(cdi, d.Name)
			}
			if !slices.Equal(cdi, tc.wantCDI) {
				t.Errorf("CDI devices = %v, want %v", cdi, tc.wantCDI)
			}
			if got := specPaths(resp.Devices); !slices.Equal(got, tc.wantSpecs) {
				t.Errorf("device specs = %v, want %v", got, tc.wantSpecs)
			}
		})
	}
}

// fakeSolver records what it was offered and answers with a fixed choice.
type fakeSolver struct {
	offered []string
	answer  []string
	err     error
}

func (f *fakeSolver) Preferred(available, mustInclude []string, size int) ([]string, error) {
	f.offered = slices.Clone(available)
	if f.err != nil {
		return nil, f.err
	}
	if f.answer != nil {
		return f.answer, nil
	}
	return available[:size], nil
}

func TestPreferredAllocatorOnlyWithSolver(t *testing.T) {
	node := loadNode(t, "h100-mig-mixed.json")
	rs, err := Resources(node, Config{MIGStrategy: MIGStrategyMixed}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if _, ok := r.(plugin.PreferredAllocator); ok {
			t.Errorf("%s is a PreferredAllocator without a solver", r.Name())
		}
	}
	rs, err = Resources(node, Config{MIGStrategy: MIGStrategyMixed}, healthMap{}, &fakeSolver{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if _, ok := r.(plugin.PreferredAllocator); !ok {
			t.Errorf("%s is not a PreferredAllocator with a solver", r.Name())
		}
	}
}

// TestPreferredAllocation covers what the gpu resource adds to the plugin
// server's checks: unhealthy devices are filtered out of the offer. Malformed
// requests and answers that are short, repeat an ID or drop a must-include
// one are rejected by the plugin server (plugin.TestGetPreferredAllocation).
func TestPreferredAllocation(t *testing.T) {
	gpu := func(i int) string { return "GPU-0000000" + string(rune('0'+i)) + "-0000-0000-0000-000000000000" }
	all := []string{gpu(0), gpu(1), gpu(2), gpu(3), gpu(4), gpu(5), gpu(6), gpu(7)}
	tests := []struct {
		name        string
		unhealthy   healthMap
		solver      *fakeSolver
		available   []string
		mustInclude []string
		size        int
		want        []string
		wantOffered []string
		wantCode    codes.Code
	}{
		{name: "passes healthy devices through", solver: &fakeSolver{}, available: all, size: 2, want: all[:2], wantOffered: all},
		{name: "unhealthy devices are not offered", unhealthy: healthMap{gpu(0): true, gpu(3): true}, solver: &fakeSolver{}, available: all, size: 2,
			want: []string{gpu(1), gpu(2)}, wantOffered: []string{gpu(1), gpu(2), gpu(4), gpu(5), gpu(6), gpu(7)}},
		{name: "must-include stays offered even if unhealthy", unhealthy: healthMap{gpu(0): true}, solver: &fakeSolver{}, available: all[:3], mustInclude: []string{gpu(0)}, size: 2,
			want: []string{gpu(0), gpu(1)}, wantOffered: all[:3]},
		{name: "too few healthy", unhealthy: healthMap{gpu(0): true}, solver: &fakeSolver{}, available: all[:2], size: 2, wantCode: codes.InvalidArgument},
		{name: "solver error", solver: &fakeSolver{err: errors.New("boom")}, available: all, size: 2, wantCode: codes.Internal},
		{name: "solver answer not offered", unhealthy: healthMap{gpu(0): true}, solver: &fakeSolver{answer: []string{gpu(0), gpu(2)}}, available: all, size: 2, wantCode: codes.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.unhealthy
			if h == nil {
				h = healthMap{}
			}
			rs, err := Resources(loadNode(t, "h100-no-mig.json"), Config{}, h, tc.solver)
			if err != nil {
				t.Fatal(err)
			}
			pa := findResource(t, rs, ResourceGPU).(plugin.PreferredAllocator)
			got, err := pa.PreferredAllocation(context.Background(), tc.available, tc.mustInclude, tc.size)
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode {
					t.Fatalf("error = %v, want code %v", err, tc.wantCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if !slices.Equal(tc.solver.offered, tc.wantOffered) {
				t.Errorf("offered %v, want %v", tc.solver.offered, tc.wantOffered)
			}
		})
	}
}

func TestLoadMIGCapsSkipsJunk(t *testing.T) {
	root := hostRoot(t, "gpu3/gi1/access 7\nnot a line\ngpu3/gi1/ci0/access 8\n")
	caps := loadMIGCaps(root)
	if caps.err != nil {
		t.Fatal(caps.err)
	}
	if caps.minors["gpu3/gi1/access"] != 7 || caps.minors["gpu3/gi1/ci0/access"] != 8 || len(caps.minors) != 2 {
		t.Errorf("minors = %v", caps.minors)
	}
	if missing := loadMIGCaps(t.TempDir()); !errors.Is(missing.err, os.ErrNotExist) {
		t.Errorf("absent file: err = %v", missing.err)
	}
}

// TestAllocateOnSimHostRoot allocates against the /dev and /proc tree the
// simulator writes, so the device specs follow what a real driver exposes.
func TestAllocateOnSimHostRoot(t *testing.T) {
	model, err := sim.Profile("dgx-h100", sim.WithMIG(1, "3g.40gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	node, err := sim.New(model, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	spec := node.Spec()
	rs, err := Resources(spec, Config{MIGStrategy: MIGStrategyMixed, PassDeviceSpecs: true, HostRoot: node.HostRoot()}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpu1 := spec.GPUs[1]
	mig := gpu1.MIG[0]
	resp, err := findResource(t, rs, "nvidia.com/mig-3g.40gb").Allocate(context.Background(), []string{mig.UUID})
	if err != nil {
		t.Fatal(err)
	}
	got := specPaths(resp.Devices)
	if len(got) != 6 {
		t.Fatalf("device specs = %v, want /dev/nvidia%d, two capability nodes and the three control nodes", got, gpu1.Minor)
	}
	if got[0] != fmt.Sprintf("/dev/nvidia%d", gpu1.Minor) {
		t.Errorf("first spec = %s, want the parent GPU /dev/nvidia%d", got[0], gpu1.Minor)
	}
	for _, p := range got[1:3] {
		if !strings.HasPrefix(p, "/dev/nvidia-caps/nvidia-cap") {
			t.Errorf("spec %s is not a MIG capability node", p)
		}
	}
	if !slices.Equal(got[3:], []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
		t.Errorf("control nodes = %v", got[3:])
	}

	// A whole GPU gets its own node and the control nodes.
	whole := spec.GPUs[4].UUID
	resp, err = findResource(t, rs, ResourceGPU).Allocate(context.Background(), []string{whole})
	if err != nil {
		t.Fatal(err)
	}
	if got := specPaths(resp.Devices); !slices.Equal(got, []string{fmt.Sprintf("/dev/nvidia%d", spec.GPUs[4].Minor), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
		t.Errorf("whole GPU specs = %v", got)
	}

	// Simulating, the runtime finds the nodes under the simulated root
	// (HostDevPrefix); the container paths stay the real ones. As root the
	// simulator makes them character devices with the driver's numbers.
	rs, err = Resources(spec, Config{PassDeviceSpecs: true, HostRoot: node.HostRoot(), HostDevPrefix: node.HostRoot()}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = findResource(t, rs, ResourceGPU).Allocate(context.Background(), []string{whole})
	if err != nil {
		t.Fatal(err)
	}
	s0 := resp.Devices[0]
	if want := fmt.Sprintf("/dev/nvidia%d", spec.GPUs[4].Minor); s0.ContainerPath != want || s0.HostPath != filepath.Join(node.HostRoot(), want) {
		t.Fatalf("simulated spec %s -> %s, want %s under %s", s0.HostPath, s0.ContainerPath, want, node.HostRoot())
	}
	if os.Geteuid() == 0 {
		var st unix.Stat_t
		if err := unix.Stat(s0.HostPath, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 195 || unix.Minor(st.Rdev) != uint32(spec.GPUs[4].Minor) {
			t.Errorf("%s: mode %o rdev %d:%d (%v), want a character device 195:%d", s0.HostPath, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), err, spec.GPUs[4].Minor)
		}
	}
}

type recorder struct{ got [][]string }

func (r *recorder) Record(ids []string) { r.got = append(r.got, slices.Clone(ids)) }

func TestAllocateRecordsGPUs(t *testing.T) {
	rec := &recorder{}
	cfg := Config{MIGStrategy: MIGStrategyMixed, HostRoot: t.TempDir(), Recorder: rec}
	rs, err := Resources(loadNode(t, "h100-mig-mixed.json"), cfg, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const gpu0 = "GPU-00000000-0000-0000-0000-000000000000"
	// Two MIG devices on GPU 0 record GPU 0 once.
	if _, err := findResource(t, rs, "nvidia.com/mig-1g.10gb").Allocate(context.Background(), []string{mig1g, "MIG-00000000-0002-0000-0000-000000000000"}); err != nil {
		t.Fatal(err)
	}
	if _, err := findResource(t, rs, ResourceGPU).Allocate(context.Background(), []string{gpu5UUID, gpu2UUID}); err != nil {
		t.Fatal(err)
	}
	// A refused request records nothing.
	if _, err := findResource(t, rs, ResourceGPU).Allocate(context.Background(), []string{"GPU-nope"}); err == nil {
		t.Fatal("unknown device allocated")
	}
	want := [][]string{{gpu0}, {gpu5UUID, gpu2UUID}}
	if fmt.Sprint(rec.got) != fmt.Sprint(want) {
		t.Errorf("recorded %v, want %v", rec.got, want)
	}
}

func BenchmarkAllocate(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{name: "envvar", cfg: Config{}},
		{name: "cdi-cri", cfg: Config{DeviceListStrategy: DeviceListCDICRI}},
		{name: "envvar+device-specs", cfg: Config{PassDeviceSpecs: true}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			model, err := sim.Profile("dgx-h100")
			if err != nil {
				b.Fatal(err)
			}
			node, err := sim.New(model, b.TempDir(), nil)
			if err != nil {
				b.Fatal(err)
			}
			cfg := tc.cfg
			cfg.HostRoot = node.HostRoot()
			rs, err := Resources(node.Spec(), cfg, healthMap{}, nil)
			if err != nil {
				b.Fatal(err)
			}
			ids := []string{model.GPUs[0].UUID, model.GPUs[1].UUID, model.GPUs[2].UUID, model.GPUs[3].UUID}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := rs[0].Allocate(ctx, ids); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

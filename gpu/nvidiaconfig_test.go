package gpu

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func ptr[T any](v T) *T { return &v }

// TestParseNVIDIAConfigExamples reads NVIDIA's own example files (see
// each file's header for its source) as the agent takes them.
func TestParseNVIDIAConfigExamples(t *testing.T) {
	gpuShared := func(replicas int) []SharedResource { return []SharedResource{{Name: ResourceGPU, Replicas: replicas}} }
	tests := []struct {
		file string
		want NVIDIAConfig
	}{
		{file: "readme-time-slicing.yaml", want: NVIDIAConfig{TimeSlicing: &TimeSlicing{Resources: gpuShared(10)}}},
		{file: "readme-rename.yaml", want: NVIDIAConfig{TimeSlicing: &TimeSlicing{RenameByDefault: true, Resources: gpuShared(10)}}},
		{file: "readme-fail-requests.yaml", want: NVIDIAConfig{TimeSlicing: &TimeSlicing{FailRequestsGreaterThanOne: true, Resources: gpuShared(10)}}},
		{file: "operator-time-slicing-config-all.yaml", want: NVIDIAConfig{MIGStrategy: ptr("none"), TimeSlicing: &TimeSlicing{Resources: gpuShared(4)}}},
		{file: "operator-time-slicing-config-fine-tesla-t4.yaml", want: NVIDIAConfig{MIGStrategy: ptr("none"), TimeSlicing: &TimeSlicing{Resources: gpuShared(4)}}},
		{file: "operator-time-slicing-config-fine-a100-40gb.yaml", want: NVIDIAConfig{MIGStrategy: ptr("mixed"), TimeSlicing: &TimeSlicing{Resources: []SharedResource{
			{Name: ResourceGPU, Replicas: 8},
			{Name: "nvidia.com/mig-1g.5gb", Replicas: 2},
			{Name: "nvidia.com/mig-2g.10gb", Replicas: 2},
			{Name: "nvidia.com/mig-3g.20gb", Replicas: 3},
			{Name: "nvidia.com/mig-7g.40gb", Replicas: 7},
		}}}},
		{file: "readme-flags.yaml", want: NVIDIAConfig{MIGStrategy: ptr("none"), PassDeviceSpecs: ptr(false), DeviceListStrategy: ptr("envvar"),
			Ignored: []string{"flags.failOnInitError: ignored: the agent never exits on an init error; a node whose GPUs NVML cannot reach is reported unfit and retried"}}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "nvidia", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseNVIDIAConfig(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("got %+v\nwant %+v", *got, tc.want)
			}
			if ts := got.TimeSlicing; ts != nil {
				if err := ts.Validate(*cmpOr(got.MIGStrategy, ptr(MIGStrategyNone))); err != nil {
					t.Errorf("does not validate: %v", err)
				}
			}
		})
	}
}

func cmpOr[T any](a, b *T) *T {
	if a != nil {
		return a
	}
	return b
}

// TestParseNVIDIAConfigRefuses: every setting the agent cannot honour is
// an error naming its key; keys NVIDIA's v1 format does not have are too.
func TestParseNVIDIAConfigRefuses(t *testing.T) {
	tests := []struct {
		name, text, wantErr string
	}{
		{"version", "version: v2\n", `version: "v2" is not v1`},
		{"unknown top-level key", "version: v1\nsharring: {}\n", "unknown field sharring"},
		{"unknown flag", "flags:\n  migStrategy: none\n  migStrategyy: mixed\n", "unknown field flags.migStrategyy"},
		{"unknown plugin flag", "flags:\n  plugin:\n    passDeviceSpec: true\n", "unknown field flags.plugin.passDeviceSpec"},
		{"unknown gfd flag", "flags:\n  gfd:\n    oneShot: true\n", "unknown field flags.gfd.oneShot"},
		{"unknown sharing key", "sharing:\n  timeslicing: {}\n", "unknown field sharing.timeslicing"},
		{"unknown time-slicing key", "sharing:\n  timeSlicing:\n    resources: []\n    replicas: 2\n", "unknown field sharing.timeSlicing.replicas"},
		{"MPS", "sharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n", "sharing.mps: MPS is not supported"},
		{"bad MIG strategy", "flags:\n  migStrategy: dynamic\n", `flags.migStrategy: "dynamic" is not one of none, single, mixed`},
		{"driver root", "flags:\n  nvidiaDriverRoot: /run/nvidia/driver\n", `flags.nvidiaDriverRoot: "/run/nvidia/driver" is not supported`},
		{"dev root", "flags:\n  nvidiaDevRoot: /run/nvidia/driver\n", `flags.nvidiaDevRoot: "/run/nvidia/driver" is not supported`},
		{"GDS", "flags:\n  gdsEnabled: true\n", "flags.gdsEnabled: true is not supported: the agent does not set NVIDIA_GDS=enabled"},
		{"GDRCopy", "flags:\n  gdrcopyEnabled: true\n", "flags.gdrcopyEnabled: true is not supported"},
		{"MOFED", "flags:\n  mofedEnabled: true\n", "flags.mofedEnabled: true is not supported"},
		{"NodeFeature API", "flags:\n  useNodeFeatureAPI: true\n", "flags.useNodeFeatureAPI: true is not supported"},
		{"Tegra discovery", "flags:\n  deviceDiscoveryStrategy: tegra\n", `flags.deviceDiscoveryStrategy: "tegra" is not supported`},
		{"index IDs", "flags:\n  plugin:\n    deviceIDStrategy: index\n", `flags.plugin.deviceIDStrategy: "index" is not supported`},
		{"CDI annotations", "flags:\n  plugin:\n    deviceListStrategy: cdi-annotations\n", "flags.plugin.deviceListStrategy: cdi-annotations is not supported"},
		{"two list strategies", "flags:\n  plugin:\n    deviceListStrategy: [envvar, cdi-cri]\n", "flags.plugin.deviceListStrategy: [envvar cdi-cri]: the agent uses exactly one of"},
		{"unknown list strategy", "flags:\n  plugin:\n    deviceListStrategy: mounts\n", `flags.plugin.deviceListStrategy: "mounts" is not one of`},
		{"list strategy not a string", "flags:\n  plugin:\n    deviceListStrategy: 3\n", "flags.plugin.deviceListStrategy: 3: want a string or a list of strings"},
		{"packed", "flags:\n  plugin:\n    sharedDevicesAllocationPolicy: packed\n", `flags.plugin.sharedDevicesAllocationPolicy: "packed" is not supported`},
		{"IMEX channels", "imex:\n  channelIDs: [0]\n", "imex.channelIDs: [0]: IMEX channels are not supported"},
		{"IMEX required", "imex:\n  required: true\n", "imex.required: true: IMEX channels are not supported"},
		{"a flag of the wrong type", "flags:\n  failOnInitError: \"maybe\"\n", `flags.failOnInitError: "maybe": want true or false`},
		{"a bad time-slicing value", "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: many\n", `sharing.timeSlicing.resources[0].replicas: "many": want an integer`},
		{"not an object", "- version: v1\n", "want an object"},
		{"empty", "", "the file is empty"},
		{"every refusal at once", "version: v2\nflags:\n  gdsEnabled: true\n  plugin:\n    deviceIDStrategy: index\n", "version: \"v2\" is not v1, the only version of NVIDIA's config file\nflags.gdsEnabled: true is not supported: the agent does not set NVIDIA_GDS=enabled in containers\nflags.plugin.deviceIDStrategy"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNVIDIAConfig([]byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestParseNVIDIAConfigAsNVIDIADoes: what NVIDIA's plugin binaries do to a
// config before use (DisableResourceNamingInConfig) is done here too, so the
// same file serves the same names; what only gpu-feature-discovery's own
// process or NVIDIA's CDI generation reads is accepted and listed.
func TestParseNVIDIAConfigAsNVIDIADoes(t *testing.T) {
	tests := []struct {
		name        string
		text        string
		want        *TimeSlicing
		wantIgnored []string
	}{
		{name: "rename without renameByDefault is dropped",
			text:        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      rename: nvidia.com/gpu-small\n",
			want:        &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2}}},
			wantIgnored: []string{"sharing.timeSlicing.resources[0].rename: nvidia.com/gpu-small ignored, as NVIDIA's plugin ignores it: the replicas are served as nvidia.com/gpu"}},
		{name: "rename other than .shared under renameByDefault is dropped",
			text:        "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      rename: nvidia.com/gpu-small\n",
			want:        &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2}}},
			wantIgnored: []string{"resources[0].rename: nvidia.com/gpu-small ignored, as NVIDIA's plugin ignores it: renameByDefault serves the replicas as nvidia.com/gpu.shared"}},
		{name: "renameByDefault's own name is kept",
			text: "sharing:\n  timeSlicing:\n    renameByDefault: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      rename: nvidia.com/gpu.shared\n",
			want: &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2, Rename: "nvidia.com/gpu.shared"}}}},
		{name: "devices other than all share every device",
			text:        "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: [0, 1]\n",
			want:        &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2}}},
			wantIgnored: []string{"resources[0].devices: ignored, as NVIDIA's plugin ignores it: every device of nvidia.com/gpu is shared"}},
		{name: "resources, GFD and CDI settings",
			text:        "resources:\n  gpus:\n  - pattern: \"*\"\n    name: gpu\nflags:\n  mpsRoot: /run/nvidia/mps\n  gfd:\n    oneshot: false\n    sleepInterval: 60s\n  plugin:\n    nvidiaCTKPath: /usr/bin/nvidia-ctk\n    cdiAnnotationPrefix: cdi.k8s.io/\n    containerDriverRoot: /driver-root\n",
			wantIgnored: []string{"flags.mpsRoot:", "flags.plugin.cdiAnnotationPrefix:", "flags.plugin.nvidiaCTKPath:", "flags.plugin.containerDriverRoot:", "flags.gfd:", "resources:"}},
		{name: "settings at the values the agent has",
			text: "flags:\n  nvidiaDriverRoot: /\n  nvidiaDevRoot: \"\"\n  gdsEnabled: false\n  gdrcopyEnabled: false\n  mofedEnabled: false\n  useNodeFeatureAPI: false\n  deviceDiscoveryStrategy: auto\n  plugin:\n    deviceListStrategy: [cdi-cri]\n    sharedDevicesAllocationPolicy: distributed\nimex:\n  channelIDs: []\n  required: false\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNVIDIAConfig([]byte(tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.TimeSlicing, tc.want) {
				t.Errorf("time-slicing = %+v, want %+v", got.TimeSlicing, tc.want)
			}
			if len(got.Ignored) != len(tc.wantIgnored) {
				t.Fatalf("ignored = %q, want %d lines like %q", got.Ignored, len(tc.wantIgnored), tc.wantIgnored)
			}
			for _, w := range tc.wantIgnored {
				if !slices.ContainsFunc(got.Ignored, func(s string) bool { return strings.Contains(s, w) }) {
					t.Errorf("ignored = %q, want a line containing %q", got.Ignored, w)
				}
			}
		})
	}
}

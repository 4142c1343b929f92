package gpu

import (
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// decodeTS reads a sharing.timeSlicing body written in YAML, as both
// config files carry it.
func decodeTS(t *testing.T, text string) (*TimeSlicing, error) {
	t.Helper()
	b, err := yaml.YAMLToJSON([]byte(text))
	if err != nil {
		t.Fatalf("test YAML: %v", err)
	}
	var ts TimeSlicing
	if err := ts.UnmarshalJSON(b); err != nil {
		return nil, err
	}
	return &ts, nil
}

func TestTimeSlicingDecode(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    *TimeSlicing
		wantErr string
	}{
		{name: "NVIDIA's README example", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 10\n",
			want: &TimeSlicing{Resources: []SharedResource{{Name: "nvidia.com/gpu", Replicas: 10}}}},
		{name: "every key", text: `
renameByDefault: true
failRequestsGreaterThanOne: true
resources:
- name: nvidia.com/gpu
  replicas: 4
  rename: nvidia.com/gpu-small
  devices: [0, "1", "2:1", GPU-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f60, MIG-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f61, MIG-GPU-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f60/3/0]
- name: nvidia.com/mig-1g.10gb
  replicas: 2
  devices: 3
- name: nvidia.com/mig-2g.20gb
  replicas: 2
  devices: all
`, want: &TimeSlicing{RenameByDefault: true, FailRequestsGreaterThanOne: true, Resources: []SharedResource{
			{Name: "nvidia.com/gpu", Replicas: 4, Rename: "nvidia.com/gpu-small", Devices: SharedDevices{List: []string{
				"0", "1", "2:1", "GPU-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f60", "MIG-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f61", "MIG-GPU-8e3f2a6c-0b1d-4c2e-9f3a-1b2c3d4e5f60/3/0"}}},
			{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Devices: SharedDevices{Count: 3}},
			{Name: "nvidia.com/mig-2g.20gb", Replicas: 2},
		}}},
		{name: "names without a domain get nvidia.com/, as NVIDIA's NewResourceName does",
			text: "resources:\n- name: gpu\n  replicas: 2\n  rename: gpu-shared\n",
			want: &TimeSlicing{Resources: []SharedResource{{Name: "nvidia.com/gpu", Replicas: 2, Rename: "nvidia.com/gpu-shared"}}}},
		{name: "unknown key", text: "resources: []\nrenameByDefualt: true\n", wantErr: "unknown field sharing.timeSlicing.renameByDefualt"},
		{name: "unknown key in a resource", text: "resources:\n- name: nvidia.com/gpu\n  replica: 2\n", wantErr: "unknown field sharing.timeSlicing.resources[0].replica"},
		{name: "replicas as a string", text: "resources:\n- name: nvidia.com/gpu\n  replicas: \"4\"\n", wantErr: `sharing.timeSlicing.resources[0].replicas: "4": want an integer`},
		{name: "replicas not an integer", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2.5\n", wantErr: "sharing.timeSlicing.resources[0].replicas: 2.5: want an integer"},
		{name: "boolean as a string", text: "failRequestsGreaterThanOne: \"yes\"\nresources: []\n", wantErr: `sharing.timeSlicing.failRequestsGreaterThanOne: "yes": want true or false`},
		{name: "resources not a list", text: "resources: nvidia.com/gpu\n", wantErr: `sharing.timeSlicing.resources: "nvidia.com/gpu": want a list`},
		{name: "devices a word other than all", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: some\n", wantErr: `sharing.timeSlicing.resources[0].devices: "some" is not "all"`},
		{name: "devices zero", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: 0\n", wantErr: "devices: 0 is not a positive count"},
		{name: "devices negative", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: -1\n", wantErr: "devices: -1 is not a positive count"},
		{name: "devices empty list", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: []\n", wantErr: "devices: the list is empty"},
		{name: "devices bad entry", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: [0, gpu1]\n", wantErr: `devices[1]: "gpu1" is not a GPU index`},
		{name: "devices negative index", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: [-1]\n", wantErr: "devices[0]: -1 is not a GPU index"},
		{name: "devices bad UUID", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: [GPU-1234]\n", wantErr: `devices[0]: "GPU-1234" is not`},
		{name: "devices listed twice", text: "resources:\n- name: nvidia.com/gpu\n  replicas: 2\n  devices: [1, \"1\"]\n", wantErr: "devices[1]: 1 is listed twice"},
		{name: "not an object", text: "[]", wantErr: "sharing.timeSlicing: want an object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeTS(t, tc.text)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestTimeSlicingValidate(t *testing.T) {
	gpu := func(replicas int) SharedResource { return SharedResource{Name: ResourceGPU, Replicas: replicas} }
	mig := func(profile string, replicas int) SharedResource {
		return SharedResource{Name: "nvidia.com/mig-" + profile, Replicas: replicas}
	}
	tests := []struct {
		name     string
		ts       *TimeSlicing
		strategy string
		wantErr  []string
	}{
		{name: "nil", ts: nil},
		{name: "GPUs under none", ts: &TimeSlicing{Resources: []SharedResource{gpu(4)}}},
		{name: "GPUs and MIG devices under mixed", strategy: MIGStrategyMixed, ts: &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{gpu(8), mig("1g.5gb", 2), mig("7g.40gb", 7)}}},
		{name: "the largest replicas", ts: &TimeSlicing{Resources: []SharedResource{gpu(MaxReplicas)}}},
		{name: "no resources", ts: &TimeSlicing{}, wantErr: []string{"sharing.timeSlicing.resources: no resources to share"}},
		{name: "one replica", ts: &TimeSlicing{Resources: []SharedResource{gpu(1)}}, wantErr: []string{"sharing.timeSlicing.resources[0].replicas: 1 is not between 2 and 1024"}},
		{name: "replicas missing", ts: &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU}}}, wantErr: []string{"resources[0].replicas: 0 is not between 2 and 1024"}},
		{name: "too many replicas", ts: &TimeSlicing{Resources: []SharedResource{gpu(MaxReplicas + 1)}}, wantErr: []string{"replicas: 1025 is not between 2 and 1024"}},
		{name: "name missing", ts: &TimeSlicing{Resources: []SharedResource{{Replicas: 2}}}, wantErr: []string{"resources[0].name: missing"}},
		{name: "a resource the agent does not serve", ts: &TimeSlicing{Resources: []SharedResource{{Name: "nvidia.com/gpus", Replicas: 2}}},
			wantErr: []string{`resources[0].name: "nvidia.com/gpus" is not a resource this agent serves`}},
		{name: "MIG resource outside mixed", strategy: MIGStrategySingle, ts: &TimeSlicing{Resources: []SharedResource{mig("1g.10gb", 2)}},
			wantErr: []string{"resources[0].name: nvidia.com/mig-1g.10gb is served only under mig-strategy mixed (it is single"}},
		{name: "MIG resource under the default strategy", ts: &TimeSlicing{Resources: []SharedResource{mig("1g.10gb", 2)}},
			wantErr: []string{"served only under mig-strategy mixed (it is none"}},
		{name: "shared twice", ts: &TimeSlicing{Resources: []SharedResource{gpu(2), gpu(4)}}, wantErr: []string{"resources[1].name: nvidia.com/gpu is already shared by resources[0]"}},
		{name: "rename outside nvidia.com", ts: &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2, Rename: "example.com/gpu"}}},
			wantErr: []string{`resources[0].rename: "example.com/gpu" is not in the nvidia.com domain`}},
		{name: "rename too long", ts: &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2, Rename: "nvidia.com/" + strings.Repeat("g", 53)}}},
			wantErr: []string{"is longer than 63 characters"}},
		{name: "rename not a resource name", ts: &TimeSlicing{Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2, Rename: "nvidia.com/gpu shared"}}},
			wantErr: []string{`resources[0].rename: "nvidia.com/gpu shared" is not a valid resource name`}},
		{name: "two resources renamed to one name", strategy: MIGStrategyMixed, ts: &TimeSlicing{Resources: []SharedResource{
			{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Rename: "nvidia.com/small"}, {Name: "nvidia.com/mig-2g.20gb", Replicas: 2, Rename: "nvidia.com/small"}}},
			wantErr: []string{"resources[1].rename: nvidia.com/small is already the name of resources[0]'s replicas"}},
		{name: "renamed onto another shared resource", strategy: MIGStrategyMixed, ts: &TimeSlicing{Resources: []SharedResource{
			{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Rename: "nvidia.com/mig-2g.20gb"}, mig("2g.20gb", 2)}},
			wantErr: []string{"resources[0].rename: nvidia.com/mig-2g.20gb is the name of resources[1], another shared resource"}},
		{name: "MIG replicas renamed to the GPU resource", strategy: MIGStrategyMixed, ts: &TimeSlicing{Resources: []SharedResource{
			{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Rename: ResourceGPU}}},
			wantErr: []string{"resources[0].rename: MIG devices cannot be served as nvidia.com/gpu"}},
		{name: "every error at once", ts: &TimeSlicing{Resources: []SharedResource{gpu(1), {Name: "nvidia.com/x", Replicas: 2}}},
			wantErr: []string{"resources[0].replicas", "resources[1].name"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.ts.Validate(tc.strategy)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error = %v, want one containing %q", err, w)
				}
			}
		})
	}
}

func TestConfigValidateChecksSharing(t *testing.T) {
	err := Config{MIGStrategy: MIGStrategyNone, TimeSlicing: &TimeSlicing{Resources: []SharedResource{{Name: "nvidia.com/mig-1g.10gb", Replicas: 2}}}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "served only under mig-strategy mixed") {
		t.Errorf("error = %v", err)
	}
}

// TestLabelSharing: what GFD's labels need of the section; its replicas
// are per resource, and renamed is GFD's isRenamed (a rename written, or
// renameByDefault's).
func TestLabelSharing(t *testing.T) {
	if s := (*TimeSlicing)(nil).LabelSharing(); s != nil {
		t.Errorf("nil section: %v", s)
	}
	ts := &TimeSlicing{Resources: []SharedResource{
		{Name: ResourceGPU, Replicas: 4},
		{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Rename: "nvidia.com/small"},
	}}
	want := topology.Sharing{
		ResourceGPU:              {Replicas: 4},
		"nvidia.com/mig-1g.10gb": {Replicas: 2, Renamed: true},
	}
	if got := ts.LabelSharing(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	ts.RenameByDefault = true
	want[ResourceGPU] = topology.SharedResource{Replicas: 4, Renamed: true}
	if got := ts.LabelSharing(); !reflect.DeepEqual(got, want) {
		t.Errorf("renameByDefault: got %v, want %v", got, want)
	}
}

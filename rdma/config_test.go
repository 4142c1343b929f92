package rdma

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string // substrings, one per expected error
	}{
		{name: "valid", cfg: Config{Resources: []ResourceConfig{
			{Name: "ib", Selectors: Selectors{Vendors: []string{"0x15b3"}, LinkTypes: []string{"ib"}}},
			{Name: "shared_roce", Mode: ModeShared, Slots: 64, Selectors: Selectors{PCIAddresses: []string{"e1:00.0"}, NUMANodes: []int{1}}},
		}}},
		{name: "bad mode", cfg: Config{Resources: []ResourceConfig{{Name: "a"}, {Name: "b", Mode: "foo"}}},
			wantErr: []string{`rdma.resources[1].mode: "foo" is not exclusive or shared`}},
		{name: "every bad field is named", cfg: Config{PollInterval: Duration(-time.Second), Resources: []ResourceConfig{
			{Name: "", Slots: 3, Selectors: Selectors{Vendors: []string{"mellanox"}, DeviceIDs: []string{"1"}, LinkTypes: []string{"fddi"}, PCIAddresses: []string{"zz"}, NUMANodes: []int{-1}}},
		}}, wantErr: []string{
			"rdma.pollInterval: -1s is negative",
			"rdma.resources[0].name: must not be empty",
			"rdma.resources[0].slots: 3 is only valid in shared mode",
			`rdma.resources[0].selectors.vendors[0]: "mellanox" is not a 4-digit hex PCI vendor ID`,
			`rdma.resources[0].selectors.deviceIDs[0]: "1" is not`,
			`rdma.resources[0].selectors.linkTypes[0]: "fddi" is not infiniband or ethernet`,
			`rdma.resources[0].selectors.pciAddresses[0]: "zz" is not a PCI address`,
			"rdma.resources[0].selectors.numaNodes[0]: -1 is negative",
		}},
		{name: "duplicate and invalid names", cfg: Config{Resources: []ResourceConfig{{Name: "x"}, {Name: "x"}, {Name: "a/b"}}},
			wantErr: []string{`rdma.resources[1].name: "x" is already used by rdma.resources[0]`, `rdma.resources[2].name: "a/b" is not a valid resource name`}},
		{name: "negative shared slots", cfg: Config{Resources: []ResourceConfig{{Name: "s", Mode: ModeShared, Slots: -1}}},
			wantErr: []string{"rdma.resources[0].slots: -1 is negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %d errors", len(tt.wantErr))
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.wantErr) {
				t.Errorf("Validate() gave %d errors, want %d:\n%v", len(lines), len(tt.wantErr), err)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v\nwant it to contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigYAML(t *testing.T) {
	in := `
allowExclusiveNetns: true
pollInterval: 500ms
resources:
- name: ib
  selectors:
    vendors: ["15b3"]
    linkTypes: [infiniband]
    numaNodes: [0, 1]
- name: roce_shared
  mode: shared
  slots: 100
  selectors:
    ifNames: [enp225s0f0np0]
    deviceIDs: ["101d"]
    drivers: [mlx5_core]
    pciAddresses: ["0000:e1:00.0"]
`
	var got Config
	if err := yaml.UnmarshalStrict([]byte(in), &got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	want := Config{
		AllowExclusiveNetns: true,
		PollInterval:        Duration(500 * time.Millisecond),
		Resources: []ResourceConfig{
			{Name: "ib", Selectors: Selectors{Vendors: []string{"15b3"}, LinkTypes: []string{"infiniband"}, NUMANodes: []int{0, 1}}},
			{Name: "roce_shared", Mode: ModeShared, Slots: 100, Selectors: Selectors{IfNames: []string{"enp225s0f0np0"}, DeviceIDs: []string{"101d"}, Drivers: []string{"mlx5_core"}, PCIAddresses: []string{"0000:e1:00.0"}}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"pollInterval":"500ms"`) {
		t.Errorf("json = %s, want pollInterval as a duration string", b)
	}
}

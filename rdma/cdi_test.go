package rdma

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestWriteCDISpec(t *testing.T) {
	devs := fixtureDevices(t, "multiport")
	dir := filepath.Join(t.TempDir(), "cdi")
	if err := WriteCDISpec(dir, devs); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, CDISpecFile))
	if err != nil {
		t.Fatal(err)
	}
	var got cdispec.Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("spec is not JSON: %v", err)
	}
	node := func(name string) *cdispec.DeviceNode {
		return &cdispec.DeviceNode{Path: "/dev/infiniband/" + name, HostPath: "/dev/infiniband/" + name, Type: "c", Permissions: "rw"}
	}
	want := cdispec.Spec{
		Version: got.Version,
		Kind:    "gpu-node-agent.io/rdma",
		Devices: []cdispec.Device{
			{Name: "mlx4_0:1", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node("uverbs0"), node("umad0"), node("issm0"), node("rdma_cm")}}},
			{Name: "mlx4_0:2", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node("uverbs0"), node("umad1"), node("issm1"), node("rdma_cm")}}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spec (-want +got):\n%s", diff)
	}
	if err := cdispec.ValidateVersion(&got); err != nil {
		t.Errorf("version %q: %v", got.Version, err)
	}
	// Every name Allocate hands out in CDI mode must be defined here.
	res, err := Resources(devs, []ResourceConfig{{Name: "ib"}}, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := res[0].Allocate(t.Context(), []string{"mlx4_0:2"})
	if err != nil {
		t.Fatal(err)
	}
	vendor, class, name, err := parser.ParseQualifiedName(resp.CdiDevices[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	if vendor+"/"+class != got.Kind || name != got.Devices[1].Name {
		t.Errorf("Allocate CDI name %s does not match the spec's %s=%s", resp.CdiDevices[0].Name, got.Kind, got.Devices[1].Name)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("cdi dir has %d entries, want only the spec (no temp files)", len(entries))
	}
}

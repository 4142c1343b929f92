package rdma

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// fixtureDevices discovers the named fixture trees and concatenates them.
func fixtureDevices(t *testing.T, names ...string) []Device {
	t.Helper()
	var out []Device
	for _, n := range names {
		devs, err := Discover(context.Background(), DiscoverOptions{Root: fixtureRoot(n)})
		if err != nil {
			t.Fatalf("discover %s: %v", n, err)
		}
		out = append(out, devs...)
	}
	return out
}

type healthMap map[string]bool

func (h healthMap) Healthy(id string) bool {
	v, ok := h[id]
	return !ok || v
}

func spec(name string) *pluginapi.DeviceSpec {
	return &pluginapi.DeviceSpec{ContainerPath: "/dev/infiniband/" + name, HostPath: "/dev/infiniband/" + name, Permissions: "rw"}
}

func TestResourcesDevices(t *testing.T) {
	devs := fixtureDevices(t, "ib", "multiport", "roce", "nonuma")
	// "ib" and "nonuma" are both mlx5_0: rename the second to keep IDs unique.
	devs[3].Name = "mlx5_9"
	cfgs := []ResourceConfig{
		{Name: "ib", Selectors: Selectors{LinkTypes: []string{"ib"}}},
		{Name: "roce", Mode: ModeShared, Slots: 3, Selectors: Selectors{LinkTypes: []string{"ethernet"}}},
		{Name: "none", Mode: ModeShared, Selectors: Selectors{Vendors: []string{"8086"}}},
	}
	res, err := Resources(devs, cfgs, healthMap{"mlx4_0:2": false}, false)
	if err != nil {
		t.Fatalf("Resources: %v", err)
	}
	var names []string
	for _, r := range res {
		names = append(names, r.Name())
	}
	if want := []string{"rdma/ib", "rdma/roce", "rdma/none"}; !slices.Equal(names, want) {
		t.Fatalf("names = %v, want %v", names, want)
	}
	wantDevs := map[string][]plugin.Device{
		"rdma/ib": {
			{ID: "mlx5_0", Healthy: true, NUMANodes: []int64{0}},
			{ID: "mlx4_0:1", Healthy: true, NUMANodes: []int64{1}},
			{ID: "mlx4_0:2", Healthy: false, NUMANodes: []int64{1}},
			{ID: "mlx5_9", Healthy: true}, // numa_node -1: no affinity
		},
		"rdma/roce": {
			{ID: "roce-0", Healthy: true, NUMANodes: []int64{1}},
			{ID: "roce-1", Healthy: true, NUMANodes: []int64{1}},
			{ID: "roce-2", Healthy: true, NUMANodes: []int64{1}},
		},
		"rdma/none": nil,
	}
	for _, r := range res {
		if diff := cmp.Diff(wantDevs[r.Name()], r.Devices()); diff != "" {
			t.Errorf("%s devices (-want +got):\n%s", r.Name(), diff)
		}
	}
	_, isPref := res[0].(plugin.PreferredAllocator)
	_, sharedPref := res[1].(plugin.PreferredAllocator)
	if !isPref || sharedPref {
		t.Errorf("PreferredAllocator: exclusive %v shared %v, want true false", isPref, sharedPref)
	}
}

func TestSharedSlotsFollowPortHealth(t *testing.T) {
	devs := fixtureDevices(t, "multiport")
	cfgs := []ResourceConfig{{Name: "hca", Mode: ModeShared, Slots: 2}}
	h := healthMap{}
	res, err := Resources(devs, cfgs, h, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		port bool
	}{{"all up", true}, {"one port down", false}, {"back up", true}} {
		h["mlx4_0:2"] = tc.port
		for _, d := range res[0].Devices() {
			if d.Healthy != tc.port {
				t.Errorf("%s: slot %s healthy = %v, want %v", tc.name, d.ID, d.Healthy, tc.port)
			}
		}
	}
}

func TestResourcesRejectsOverlappingExclusive(t *testing.T) {
	devs := fixtureDevices(t, "ib")
	_, err := Resources(devs, []ResourceConfig{{Name: "a"}, {Name: "b", Selectors: Selectors{Drivers: []string{"mlx5_core"}}}}, nil, false)
	if err == nil || !strings.Contains(err.Error(), "port mlx5_0 is already in exclusive resource rdma/a") {
		t.Errorf("Resources error = %v, want overlap error", err)
	}
	if _, err := Resources(devs, []ResourceConfig{{Name: "a"}, {Name: "b", Mode: ModeShared}}, nil, false); err == nil ||
		!strings.Contains(err.Error(), "rdma.resources[1]: port mlx5_0 is already in exclusive resource rdma/a") {
		t.Errorf("Resources with exclusive then shared overlap = %v, want error", err)
	}
	if _, err := Resources(devs, []ResourceConfig{{Name: "s", Mode: ModeShared}, {Name: "a"}}, nil, false); err == nil ||
		!strings.Contains(err.Error(), "exclusive resource rdma/a selects port mlx5_0, which resource rdma/s also uses") {
		t.Errorf("Resources with shared then exclusive overlap = %v, want error", err)
	}
	// Shared resources may overlap each other.
	if _, err := Resources(devs, []ResourceConfig{{Name: "s1", Mode: ModeShared}, {Name: "s2", Mode: ModeShared}}, nil, false); err != nil {
		t.Errorf("Resources with two shared resources on one port: %v", err)
	}
	if _, err := Resources(devs, []ResourceConfig{{Name: "a", Mode: "foo"}}, nil, false); err == nil || !strings.Contains(err.Error(), `rdma.resources[0].mode: "foo"`) {
		t.Errorf("Resources with bad mode = %v, want validation error", err)
	}
}

func TestAllocate(t *testing.T) {
	devs := fixtureDevices(t, "ib", "multiport", "roce", "nordmacm")
	devs[3].Name = "mlx5_1" // nordmacm's mlx5_0 duplicates ib's name
	devs[3].Ports[0].UMAD = &CharDev{Name: "umad7", Path: "/dev/infiniband/umad7", HostPath: "/dev/infiniband/umad7"}
	devs[3].Ports[0].ISSM = &CharDev{Name: "issm7", Path: "/dev/infiniband/issm7", HostPath: "/dev/infiniband/issm7"}
	devs[3].UVerbs = &CharDev{Name: "uverbs7", Path: "/dev/infiniband/uverbs7", HostPath: "/dev/infiniband/uverbs7"}
	cfgs := []ResourceConfig{
		{Name: "ib", Selectors: Selectors{LinkTypes: []string{"ib"}}},
		{Name: "roce", Mode: ModeShared, Slots: 4, Selectors: Selectors{LinkTypes: []string{"ethernet"}}},
	}
	tests := []struct {
		name     string
		resource int
		cdi      bool
		ids      []string
		want     *pluginapi.ContainerAllocateResponse
		wantErr  string
	}{
		{
			name: "one ib port", resource: 0, ids: []string{"mlx5_0"},
			want: &pluginapi.ContainerAllocateResponse{
				Devices: []*pluginapi.DeviceSpec{spec("uverbs0"), spec("umad0"), spec("issm0"), spec("rdma_cm")},
				Envs:    map[string]string{EnvDevices: "mlx5_0", EnvNCCLHCA: "=mlx5_0:1", EnvNetDevs: "ib0"},
			},
		},
		{
			name: "both ports of a dual-port hca share uverbs", resource: 0, ids: []string{"mlx4_0:1", "mlx4_0:2"},
			want: &pluginapi.ContainerAllocateResponse{
				Devices: []*pluginapi.DeviceSpec{spec("uverbs0"), spec("umad0"), spec("issm0"), spec("rdma_cm"), spec("umad1"), spec("issm1")},
				Envs:    map[string]string{EnvDevices: "mlx4_0", EnvNCCLHCA: "=mlx4_0:1,mlx4_0:2", EnvNetDevs: "ib0,ib1"},
			},
		},
		{
			name: "device without rdma_cm", resource: 0, ids: []string{"mlx5_1"},
			want: &pluginapi.ContainerAllocateResponse{
				Devices: []*pluginapi.DeviceSpec{spec("uverbs7"), spec("umad7"), spec("issm7")},
				Envs:    map[string]string{EnvDevices: "mlx5_1", EnvNCCLHCA: "=mlx5_1:1", EnvNetDevs: "ib0"},
			},
		},
		{
			name: "cdi names instead of device specs", resource: 0, cdi: true, ids: []string{"mlx5_0", "mlx4_0:2"},
			want: &pluginapi.ContainerAllocateResponse{
				CdiDevices: []*pluginapi.CDIDevice{{Name: "gpu-node-agent.io/rdma=mlx5_0"}, {Name: "gpu-node-agent.io/rdma=mlx4_0:2"}},
				Envs:       map[string]string{EnvDevices: "mlx5_0,mlx4_0", EnvNCCLHCA: "=mlx5_0:1,mlx4_0:2", EnvNetDevs: "ib0,ib1"},
			},
		},
		{
			name: "shared slot gives every selected port, no issm on roce", resource: 1, ids: []string{"roce-3"},
			want: &pluginapi.ContainerAllocateResponse{
				Devices: []*pluginapi.DeviceSpec{spec("uverbs4"), spec("umad4"), spec("rdma_cm")},
				Envs:    map[string]string{EnvDevices: "mlx5_4", EnvNCCLHCA: "=mlx5_4:1", EnvNetDevs: "enp225s0f0np0"},
			},
		},
		{name: "unknown id", resource: 0, ids: []string{"mlx5_7"}, wantErr: `allocate rdma/ib: unknown device "mlx5_7"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Resources(devs, cfgs, nil, tt.cdi)
			if err != nil {
				t.Fatal(err)
			}
			got, err := res[tt.resource].Allocate(context.Background(), tt.ids)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Allocate error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpProto...); diff != "" {
				t.Errorf("Allocate (-want +got):\n%s", diff)
			}
		})
	}
}

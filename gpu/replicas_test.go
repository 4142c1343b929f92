package gpu

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// uuidOf is the fixtures' GPU UUID of index i.
func uuidOf(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

// replicasOf lists replica IDs uuid::0..n-1.
func replicasOf(uuid string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = uuid + "::" + fmt.Sprint(i)
	}
	return out
}

// idsOf is the device IDs of a resource, in its order.
func idsOf(r plugin.Resource) []string {
	var out []string
	for _, d := range r.Devices() {
		out = append(out, d.ID)
	}
	return out
}

func shared(resources ...SharedResource) *TimeSlicing { return &TimeSlicing{Resources: resources} }

// TestSharedResources: which devices are replicated, under which names and
// IDs (NVIDIA's internal/rm/device_map.go updateDeviceMapWithReplicas), and
// what is refused.
func TestSharedResources(t *testing.T) {
	gpus := func(idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, uuidOf(i))
		}
		return out
	}
	replicas := func(n int, idx ...int) []string {
		var out []string
		for _, i := range idx {
			out = append(out, replicasOf(uuidOf(i), n)...)
		}
		return out
	}
	mig1g := []string{"MIG-00000000-0001-0000-0000-000000000000", "MIG-00000000-0002-0000-0000-000000000000", "MIG-00000000-0003-0000-0000-000000000000"}
	var mig1gReplicas []string
	for _, m := range mig1g {
		mig1gReplicas = append(mig1gReplicas, replicasOf(m, 2)...)
	}
	tests := []struct {
		name     string
		fixture  string
		strategy string
		ts       *TimeSlicing
		want     map[string][]string // resource -> device IDs, in order
		counts   map[string]int      // resource -> device count, when want does not list it
		wantErr  string
	}{
		{name: "every GPU, 4 replicas", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 4}),
			want: map[string][]string{ResourceGPU: replicas(4, 0, 1, 2, 3, 4, 5, 6, 7)}},
		{name: "renameByDefault", fixture: "h100-no-mig.json", ts: &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2}}},
			want: map[string][]string{"nvidia.com/gpu.shared": replicas(2, 0, 1, 2, 3, 4, 5, 6, 7)}},
		{name: "rename", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 2, Rename: "nvidia.com/gpu-small"}),
			want: map[string][]string{"nvidia.com/gpu-small": replicas(2, 0, 1, 2, 3, 4, 5, 6, 7)}},
		{name: "a count of devices: the first ones, the rest unshared under the same name", fixture: "h100-no-mig.json",
			ts:   shared(SharedResource{Name: ResourceGPU, Replicas: 3, Devices: SharedDevices{Count: 2}}),
			want: map[string][]string{ResourceGPU: append(gpus(2, 3, 4, 5, 6, 7), replicas(3, 0, 1)...)}},
		{name: "a count of devices renamed by default", fixture: "h100-no-mig.json",
			ts:   &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 3, Devices: SharedDevices{Count: 2}}}},
			want: map[string][]string{ResourceGPU: gpus(2, 3, 4, 5, 6, 7), "nvidia.com/gpu.shared": replicas(3, 0, 1)}},
		{name: "a list of an index and a UUID", fixture: "h100-no-mig.json",
			ts:   &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{List: []string{uuidOf(5), "1"}}}}},
			want: map[string][]string{ResourceGPU: gpus(0, 2, 3, 4, 6, 7), "nvidia.com/gpu.shared": replicas(2, 1, 5)}},
		{name: "MIG devices under mixed; other resources untouched", fixture: "h100-mig-mixed.json", strategy: MIGStrategyMixed,
			ts:     shared(SharedResource{Name: "nvidia.com/mig-1g.10gb", Replicas: 2}),
			want:   map[string][]string{"nvidia.com/mig-1g.10gb": mig1gReplicas, ResourceGPU: gpus(2, 3, 4, 5, 6, 7)},
			counts: map[string]int{"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-1g.10gb.me": 1}},
		{name: "MIG devices by MIG index, renamed", fixture: "h100-mig-mixed.json", strategy: MIGStrategyMixed,
			ts: &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{
				{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Devices: SharedDevices{List: []string{"0:2"}}},
				{Name: ResourceGPU, Replicas: 2},
			}},
			want: map[string][]string{
				"nvidia.com/mig-1g.10gb":        {mig1g[0], mig1g[2]},
				"nvidia.com/mig-1g.10gb.shared": replicasOf(mig1g[1], 2),
				"nvidia.com/gpu.shared":         replicas(2, 2, 3, 4, 5, 6, 7),
			},
			counts: map[string]int{"nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-1g.10gb.me": 1}},
		{name: "MIG devices under single are nvidia.com/gpu", fixture: "h100-mig-uniform.json", strategy: MIGStrategySingle,
			ts: shared(SharedResource{Name: ResourceGPU, Replicas: 2}), counts: map[string]int{ResourceGPU: 112}},
		{name: "a resource the node does not have is skipped", fixture: "h100-mig-mixed.json", strategy: MIGStrategyMixed,
			ts:     shared(SharedResource{Name: "nvidia.com/mig-7g.80gb", Replicas: 2}),
			counts: map[string]int{ResourceGPU: 6, "nvidia.com/mig-1g.10gb": 3, "nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 2, "nvidia.com/mig-1g.10gb.me": 1}},
		{name: "more devices counted than there are", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{Count: 9}}),
			wantErr: "sharing.timeSlicing.resources[0].devices: 9 devices to share, but the resource has 8"},
		{name: "a GPU index the node does not have", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{List: []string{"8"}}}),
			wantErr: "sharing.timeSlicing.resources[0].devices: 8 is not a device of the resource on this node"},
		{name: "a MIG index on the GPU resource", fixture: "h100-mig-mixed.json", strategy: MIGStrategyMixed,
			ts:      shared(SharedResource{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{List: []string{"0:1"}}}),
			wantErr: "0:1 is not a device of the resource on this node"},
		{name: "renamed onto a resource of other devices", fixture: "h100-mig-mixed.json", strategy: MIGStrategyMixed,
			ts:      shared(SharedResource{Name: ResourceGPU, Replicas: 2, Rename: "nvidia.com/mig-3g.40gb"}),
			wantErr: "sharing.timeSlicing: the replicas of nvidia.com/gpu would be served as nvidia.com/mig-3g.40gb, a resource of nvidia.com/mig-3g.40gb"},
		{name: "too many devices for the kubelet's list", fixture: "h100-mig-uniform.json", strategy: MIGStrategyMixed,
			ts:      shared(SharedResource{Name: "nvidia.com/mig-1g.10gb", Replicas: 300}),
			wantErr: "nvidia.com/mig-1g.10gb would have 16800 devices; at most 16384"},
		{name: "an invalid section is refused", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 1}),
			wantErr: "replicas: 1 is not between 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Resources(loadNode(t, tc.fixture), Config{MIGStrategy: tc.strategy, TimeSlicing: tc.ts}, healthMap{}, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := len(rs), len(tc.want)+len(tc.counts); got != want {
				t.Errorf("%d resources %v, want %d", got, counts(rs), want)
			}
			for name, ids := range tc.want {
				if got := idsOf(findResource(t, rs, name)); !slices.Equal(got, ids) {
					t.Errorf("%s: devices\n%v\nwant\n%v", name, got, ids)
				}
			}
			for name, n := range tc.counts {
				if got := len(findResource(t, rs, name).Devices()); got != n {
					t.Errorf("%s: %d devices, want %d", name, got, n)
				}
			}
		})
	}
}

// TestReplicaNUMAAndHealth: a replica carries its device's NUMA node and is
// healthy exactly when that device is (and, for MIG, its parent GPU); a
// lost GPU's replicas are unhealthy.
func TestReplicaNUMAAndHealth(t *testing.T) {
	node := loadNode(t, "h100-mig-mixed.json")
	node.GPUs[4].Lost = true
	ts := shared(SharedResource{Name: ResourceGPU, Replicas: 3}, SharedResource{Name: "nvidia.com/mig-1g.10gb", Replicas: 2})
	h := healthMap{uuidOf(3): true, uuidOf(0): true} // GPU 0 is the parent of the 1g.10gb devices
	rs, err := Resources(node, Config{MIGStrategy: MIGStrategyMixed, TimeSlicing: ts}, h, nil)
	if err != nil {
		t.Fatal(err)
	}
	numa := map[string][]int64{}
	for _, g := range node.GPUs {
		numa[g.UUID] = numaOf(g.NUMANode)
		for _, m := range g.MIG {
			numa[m.UUID] = numaOf(g.NUMANode)
		}
	}
	var sick []string
	for _, r := range []string{ResourceGPU, "nvidia.com/mig-1g.10gb"} {
		for _, d := range findResource(t, rs, r).Devices() {
			base := SharedUUID(d.ID)
			if !slices.Equal(d.NUMANodes, numa[base]) {
				t.Errorf("%s: NUMA %v, want %v (its device's)", d.ID, d.NUMANodes, numa[base])
			}
			if !d.Healthy {
				sick = append(sick, d.ID)
			}
		}
	}
	want := append(append(replicasOf(uuidOf(3), 3), replicasOf(uuidOf(4), 3)...),
		append(append(replicasOf("MIG-00000000-0001-0000-0000-000000000000", 2), replicasOf("MIG-00000000-0002-0000-0000-000000000000", 2)...),
			replicasOf("MIG-00000000-0003-0000-0000-000000000000", 2)...)...)
	if !slices.Equal(sick, want) {
		t.Errorf("unhealthy\n%v\nwant\n%v", sick, want)
	}
}

func numaOf(n int) []int64 {
	if n < 0 {
		return nil
	}
	return []int64{int64(n)}
}

// TestAllocateReplicas: replicas map back to their device, each device
// once, under every device-list strategy; failRequestsGreaterThanOne
// refuses more than one device when one is a replica (NVIDIA's
// internal/rm/rm.go ValidateRequest), and only then.
func TestAllocateReplicas(t *testing.T) {
	g2, g5 := uuidOf(2), uuidOf(5)
	r := func(uuid string, n int) string { return uuid + "::" + fmt.Sprint(n) }
	tests := []struct {
		name      string
		cfg       Config
		ts        *TimeSlicing
		ids       []string
		wantEnv   string
		wantMount []string
		wantCDI   []string
		wantSpecs []string
		wantErr   string
	}{
		{name: "one replica", ids: []string{r(g2, 3)}, wantEnv: g2},
		{name: "two replicas of one GPU give it once", ids: []string{r(g2, 0), r(g2, 1)}, wantEnv: g2},
		{name: "replicas of two GPUs", ids: []string{r(g5, 1), r(g2, 0), r(g5, 0)}, wantEnv: g5 + "," + g2},
		{name: "volume mounts per GPU", cfg: Config{DeviceListStrategy: DeviceListVolumeMounts}, ids: []string{r(g2, 0), r(g2, 1)},
			wantEnv: volumeMountsRoot, wantMount: []string{"/dev/null->/var/run/nvidia-container-devices/" + g2}},
		{name: "CDI names per GPU", cfg: Config{DeviceListStrategy: DeviceListCDICRI}, ids: []string{r(g2, 0), r(g5, 2), r(g2, 1)},
			wantCDI: []string{"nvidia.com/gpu=" + g2, "nvidia.com/gpu=" + g5}},
		{name: "device specs per GPU", cfg: Config{PassDeviceSpecs: true}, ids: []string{r(g2, 0), r(g2, 1)}, wantEnv: g2,
			wantSpecs: []string{"/dev/nvidia2", "/dev/nvidiactl"}},
		{name: "failRequestsGreaterThanOne: two replicas of one GPU refused", ts: &TimeSlicing{FailRequestsGreaterThanOne: true},
			ids: []string{r(g2, 0), r(g2, 1)}, wantErr: "nvidia.com/gpu: maximum request size for shared resources is 1; found 2"},
		{name: "failRequestsGreaterThanOne: replicas of two GPUs refused", ts: &TimeSlicing{FailRequestsGreaterThanOne: true},
			ids: []string{r(g2, 0), r(g5, 0), r(g5, 1)}, wantErr: "found 3"},
		{name: "failRequestsGreaterThanOne: one replica allowed", ts: &TimeSlicing{FailRequestsGreaterThanOne: true}, ids: []string{r(g5, 3)}, wantEnv: g5},
		{name: "failRequestsGreaterThanOne: a whole GPU and a replica refused", ts: &TimeSlicing{FailRequestsGreaterThanOne: true,
			Resources: []SharedResource{{Name: ResourceGPU, Replicas: 4, Devices: SharedDevices{List: []string{"5"}}}}},
			ids: []string{g2, r(g5, 0)}, wantErr: "found 2"},
		{name: "failRequestsGreaterThanOne: whole GPUs of a partly shared resource allowed", ts: &TimeSlicing{FailRequestsGreaterThanOne: true,
			Resources: []SharedResource{{Name: ResourceGPU, Replicas: 4, Devices: SharedDevices{List: []string{"5"}}}}},
			ids: []string{g2, uuidOf(3)}, wantEnv: g2 + "," + uuidOf(3)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.HostRoot = hostRoot(t, "", "dev/nvidia2", "dev/nvidiactl")
			cfg.TimeSlicing = shared(SharedResource{Name: ResourceGPU, Replicas: 4})
			if tc.ts != nil {
				cfg.TimeSlicing.FailRequestsGreaterThanOne = tc.ts.FailRequestsGreaterThanOne
				if tc.ts.Resources != nil {
					cfg.TimeSlicing.Resources = tc.ts.Resources
				}
			}
			rec := &recorder{}
			cfg.Recorder = rec
			rs, err := Resources(loadNode(t, "h100-no-mig.json"), cfg, healthMap{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := findResource(t, rs, ResourceGPU).Allocate(context.Background(), tc.ids)
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want InvalidArgument containing %q", err, tc.wantErr)
				}
				if len(rec.got) != 0 {
					t.Errorf("a refused request recorded %v", rec.got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.Envs[visibleDevicesEnv]; got != tc.wantEnv {
				t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q", got, tc.wantEnv)
			}
			var mounts, cdi []string
			for _, m := range resp.Mounts {
				mounts = append(mounts, m.HostPath+"->"+m.ContainerPath)
			}
			for _, d := range resp.CdiDevices {
				cdi = append(cdi, d.Name)
			}
			if !slices.Equal(mounts, tc.wantMount) {
				t.Errorf("mounts = %v, want %v", mounts, tc.wantMount)
			}
			if !slices.Equal(cdi, tc.wantCDI) {
				t.Errorf("CDI = %v, want %v", cdi, tc.wantCDI)
			}
			if got := specPaths(resp.Devices); !slices.Equal(got, tc.wantSpecs) {
				t.Errorf("device specs = %v, want %v", got, tc.wantSpecs)
			}
			// The RDMA recorder is told each GPU once.
			var want []string
			for _, id := range tc.ids {
				if u := SharedUUID(id); !slices.Contains(want, u) {
					want = append(want, u)
				}
			}
			if len(rec.got) != 1 || !slices.Equal(rec.got[0], want) {
				t.Errorf("recorded %v, want [%v]", rec.got, want)
			}
		})
	}
}

// TestSpreadReplicas: GetPreferredAllocation of replicas spreads a request
// over distinct devices when it can, the least loaded first; when it
// cannot, evenly. Unhealthy replicas are not chosen.
func TestSpreadReplicas(t *testing.T) {
	r := func(gpu, n int) string { return uuidOf(gpu) + "::" + fmt.Sprint(n) }
	// avail lists replicas of the given GPUs, n of each from 0 (with
	// replicas 4 the rest are held by other containers).
	avail := func(n int, gpus ...int) []string {
		var out []string
		for _, g := range gpus {
			for i := range n {
				out = append(out, r(g, i))
			}
		}
		return out
	}
	tests := []struct {
		name        string
		unhealthy   healthMap
		available   []string
		mustInclude []string
		size        int
		want        []string
		wantErr     codes.Code
	}{
		{name: "one replica: the first GPU when all are free", available: avail(4, 0, 1, 2, 3, 4, 5, 6, 7), size: 1, want: []string{r(0, 0)}},
		{name: "one replica: the least loaded GPU", available: append(avail(2, 0, 1), avail(4, 2)...), size: 1, want: []string{r(2, 0)}},
		{name: "two replicas: two GPUs, not one", available: avail(4, 0, 1, 2, 3, 4, 5, 6, 7), size: 2, want: []string{r(0, 0), r(1, 0)}},
		{name: "three replicas: the three least loaded GPUs", available: append(append(avail(1, 0), avail(3, 1, 2)...), avail(4, 3)...), size: 3,
			want: []string{r(3, 0), r(1, 0), r(2, 0)}},
		{name: "a must-include counts: the rest avoid its GPU", available: avail(4, 0, 1), mustInclude: []string{r(0, 2)}, size: 2, want: []string{r(0, 2), r(1, 0)}},
		{name: "more than there are GPUs: evenly", available: avail(4, 0, 1, 2), size: 5, want: []string{r(0, 0), r(1, 0), r(2, 0), r(0, 1), r(1, 1)}},
		{name: "evenly, whatever the load: no GPU gets a third replica before each has two", available: append(avail(4, 0), avail(2, 1)...), size: 4,
			want: []string{r(0, 0), r(1, 0), r(0, 1), r(1, 1)}},
		{name: "only one GPU on offer", available: avail(3, 6), size: 2, want: []string{r(6, 0), r(6, 1)}},
		{name: "unhealthy GPUs' replicas are not chosen", unhealthy: healthMap{uuidOf(0): true}, available: avail(4, 0, 1, 2), size: 2, want: []string{r(1, 0), r(2, 0)}},
		{name: "too few healthy", unhealthy: healthMap{uuidOf(0): true}, available: avail(2, 0, 1), size: 3, wantErr: codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.unhealthy
			if h == nil {
				h = healthMap{}
			}
			solver := &fakeSolver{}
			rs, err := Resources(loadNode(t, "h100-no-mig.json"), Config{TimeSlicing: shared(SharedResource{Name: ResourceGPU, Replicas: 4})}, h, solver)
			if err != nil {
				t.Fatal(err)
			}
			got, err := findResource(t, rs, ResourceGPU).(plugin.PreferredAllocator).PreferredAllocation(context.Background(), tc.available, tc.mustInclude, tc.size)
			if tc.wantErr != codes.OK {
				if status.Code(err) != tc.wantErr {
					t.Fatalf("error = %v, want code %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if solver.offered != nil {
				t.Errorf("the topology solver was asked about replicas: %v", solver.offered)
			}
		})
	}
}

// TestSpreadProperties checks spread on random offers: the answer has size
// distinct offered IDs with every must-include one; it uses as many
// distinct devices as the offer allows; the replicas it adds are spread
// evenly (per device, counts differ by at most one among devices that
// still had replicas on offer).
func TestSpreadProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 2))
	node := loadNode(t, "h100-mig-mixed.json")
	ts := shared(SharedResource{Name: ResourceGPU, Replicas: 5}, SharedResource{Name: "nvidia.com/mig-1g.10gb", Replicas: 3})
	rs, err := Resources(node, Config{MIGStrategy: MIGStrategyMixed, TimeSlicing: ts}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ResourceGPU, "nvidia.com/mig-1g.10gb"} {
		res := findResource(t, rs, name)
		all := idsOf(res)
		for iter := range 500 {
			var offer []string
			for _, id := range all {
				if rng.IntN(3) > 0 {
					offer = append(offer, id)
				}
			}
			if len(offer) == 0 {
				continue
			}
			size := 1 + rng.IntN(len(offer))
			var must []string
			for _, id := range offer {
				if len(must) < size && rng.IntN(8) == 0 {
					must = append(must, id)
				}
			}
			got, err := res.(plugin.PreferredAllocator).PreferredAllocation(context.Background(), offer, must, size)
			if err != nil {
				t.Fatalf("%s #%d: %v", name, iter, err)
			}
			if len(got) != size || len(slices.Compact(slices.Sorted(slices.Values(got)))) != size {
				t.Fatalf("%s #%d: got %v, want %d distinct", name, iter, got, size)
			}
			perDevice := map[string]int{}
			offered := map[string]int{}
			for _, id := range offer {
				offered[SharedUUID(id)]++
			}
			for _, id := range got {
				if !slices.Contains(offer, id) {
					t.Fatalf("%s #%d: %s was not offered", name, iter, id)
				}
				perDevice[SharedUUID(id)]++
			}
			for _, id := range must {
				if !slices.Contains(got, id) {
					t.Fatalf("%s #%d: must-include %s left out", name, iter, id)
				}
			}
			if want := min(size, len(offered)); len(perDevice) < want && len(must) <= 1 {
				t.Fatalf("%s #%d: %d distinct devices, %d possible: %v", name, iter, len(perDevice), want, got)
			}
			if len(must) == 0 {
				lo, hi := size, 0
				for dev, n := range offered {
					c := perDevice[dev]
					if c < n { // the device had a replica left: it bounds the minimum
						lo = min(lo, c)
					}
					hi = max(hi, c)
				}
				if hi-lo > 1 {
					t.Fatalf("%s #%d: uneven spread %v over offer %v", name, iter, perDevice, offered)
				}
			}
		}
	}
}

// TestSharedResourceIsPreferredAllocatorWithoutSolver: replicas are spread
// even when no topology solver exists.
func TestSharedResourceIsPreferredAllocatorWithoutSolver(t *testing.T) {
	rs, err := Resources(loadNode(t, "h100-no-mig.json"), Config{TimeSlicing: shared(SharedResource{Name: ResourceGPU, Replicas: 2})}, healthMap{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pa, ok := findResource(t, rs, ResourceGPU).(plugin.PreferredAllocator)
	if !ok {
		t.Fatal("a shared resource is not a PreferredAllocator")
	}
	got, err := pa.PreferredAllocation(context.Background(), replicasOf(uuidOf(0), 2), nil, 2)
	if err != nil || !slices.Equal(got, replicasOf(uuidOf(0), 2)) {
		t.Errorf("got %v, %v", got, err)
	}
}

// TestUnsharedResourceKeepsSolver: with replicas configured for another
// resource, whole devices are still chosen by the topology solver.
func TestUnsharedResourceKeepsSolver(t *testing.T) {
	solver := &fakeSolver{}
	ts := shared(SharedResource{Name: "nvidia.com/mig-1g.10gb", Replicas: 2})
	rs, err := Resources(loadNode(t, "h100-mig-mixed.json"), Config{MIGStrategy: MIGStrategyMixed, TimeSlicing: ts}, healthMap{}, solver)
	if err != nil {
		t.Fatal(err)
	}
	avail := []string{uuidOf(2), uuidOf(3), uuidOf(4)}
	if _, err := findResource(t, rs, ResourceGPU).(plugin.PreferredAllocator).PreferredAllocation(context.Background(), avail, nil, 2); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(solver.offered, avail) {
		t.Errorf("solver offered %v, want %v", solver.offered, avail)
	}
}

func TestReplicaIDs(t *testing.T) {
	if got := ReplicaID("GPU-a", 3); got != "GPU-a::3" {
		t.Errorf("ReplicaID = %q", got)
	}
	for id, want := range map[string]string{"GPU-a::3": "GPU-a", "MIG-b::0": "MIG-b", "GPU-c": "GPU-c"} {
		if got := SharedUUID(id); got != want {
			t.Errorf("SharedUUID(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestShares: the devices the DRA driver publishes as shared, by UUID,
// chosen as the device plugin chooses its replicated devices.
func TestShares(t *testing.T) {
	mig1g := []string{"MIG-00000000-0001-0000-0000-000000000000", "MIG-00000000-0002-0000-0000-000000000000", "MIG-00000000-0003-0000-0000-000000000000"}
	tests := []struct {
		name    string
		fixture string
		ts      *TimeSlicing
		want    map[string]Share
		wantErr string
	}{
		{name: "nothing shared", fixture: "h100-no-mig.json", ts: nil},
		{name: "a count of GPUs, renamed by default", fixture: "h100-no-mig.json",
			ts:   &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{{Name: ResourceGPU, Replicas: 3, Devices: SharedDevices{Count: 2}}}},
			want: map[string]Share{uuidOf(0): {3, "nvidia.com/gpu.shared"}, uuidOf(1): {3, "nvidia.com/gpu.shared"}}},
		{name: "a list, not renamed", fixture: "h100-no-mig.json",
			ts:   shared(SharedResource{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{List: []string{uuidOf(5), "1"}}}),
			want: map[string]Share{uuidOf(1): {2, ResourceGPU}, uuidOf(5): {2, ResourceGPU}}},
		{name: "a MIG device by index; GPUs in MIG mode are never whole", fixture: "h100-mig-mixed.json",
			ts: &TimeSlicing{RenameByDefault: true, Resources: []SharedResource{
				{Name: "nvidia.com/mig-1g.10gb", Replicas: 2, Devices: SharedDevices{List: []string{"0:2"}}},
				{Name: ResourceGPU, Replicas: 4, Devices: SharedDevices{Count: 1}},
			}},
			want: map[string]Share{mig1g[1]: {2, "nvidia.com/mig-1g.10gb.shared"}, uuidOf(2): {4, "nvidia.com/gpu.shared"}}},
		{name: "a GPU the node does not have", fixture: "h100-no-mig.json", ts: shared(SharedResource{Name: ResourceGPU, Replicas: 2, Devices: SharedDevices{List: []string{"8"}}}),
			wantErr: "sharing.timeSlicing.resources[0].devices: 8 is not a device of the resource on this node"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.ts.Shares(loadNode(t, tc.fixture))
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("shares %v, want %v", got, tc.want)
			}
		})
	}
}

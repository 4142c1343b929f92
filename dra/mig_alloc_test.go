package dra

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// onDemandNode is profile's simulated node discovered as the agent does
// with dra.migOnDemand: through the NVML owner, the MIG profiles of every
// GPU in MIG mode read. It returns the node, the simulator and its root.
func onDemandNode(t *testing.T, profile string, opts ...sim.ProfileOption) (*topology.Node, *sim.Node, string) {
	t.Helper()
	spec, err := sim.Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	node, err := sim.New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := nvmlowner.New(node.NVML(), nvmlowner.Config{}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Shutdown(context.Background()) })
	x := nvmlowner.NewDiscoverer(o, root, nil)
	x.SetOptions(nvmlowner.DiscoverOptions{MIGProfiles: true})
	n, err := x.Discover(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return n, node, root
}

func buildOnDemand(t *testing.T, n *topology.Node, root string, made MadeSet) Result {
	t.Helper()
	res, err := Build(n, Options{PCIeRoot: SysfsPCIeRoot(root), OnDemandMIG: true, Made: made})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unread) > 0 {
		t.Fatalf("unread: %v", res.Unread)
	}
	return res
}

// allMIGMode puts every GPU of an 8-GPU profile in MIG mode with no MIG
// device.
func allMIGMode() []sim.ProfileOption {
	var out []sim.ProfileOption
	for i := range 8 {
		out = append(out, sim.WithMIG(i))
	}
	return out
}

// TestOnDemandSlices: a DGX H100 with every GPU in MIG mode and no MIG
// device publishes, per GPU, a counter set of its memory slices and
// engines and one device per placement of every profile, consuming the
// slices it covers; nothing whole. The slices are within the API's
// limits: counter sets in a slice of their own, at most 64 devices a
// slice. Logged: the three ways a DGX H100 is published.
func TestOnDemandSlices(t *testing.T) {
	n, _, root := onDemandNode(t, "dgx-h100", allMIGMode()...)
	res := buildOnDemand(t, n, root, nil)
	devs := byName(res.Devices)
	if len(res.CounterSets) != 8 {
		t.Fatalf("%d counter sets, want one per GPU", len(res.CounterSets))
	}
	for _, g := range n.GPUs {
		if len(g.MIGProfiles) == 0 {
			t.Fatalf("GPU %d: no MIG profile read", g.Index)
		}
		if _, whole := devs[GPUName(g.Index)]; whole {
			t.Errorf("GPU %d in MIG mode published whole", g.Index)
		}
		set := res.CounterSets[g.Index]
		if set.Name != CounterSetName(g.Index) {
			t.Fatalf("counter set %d is %s", g.Index, set.Name)
		}
		for _, p := range g.MIGProfiles {
			for _, pl := range p.Placements {
				name := PlacementName(g.Index, p.Name, pl.Start)
				d, ok := devs[name]
				if !ok {
					t.Fatalf("placement %s not published", name)
				}
				if str(d, AttrProfile) != p.Name || str(d, AttrType) != TypeMIG || str(d, AttrParentUUID) != g.UUID || str(d, AttrUUID) != "" {
					t.Errorf("%s: attributes %v", name, d.Attributes)
				}
				if len(d.ConsumesCounters) != 1 || d.ConsumesCounters[0].CounterSet != set.Name {
					t.Fatalf("%s consumes %+v", name, d.ConsumesCounters)
				}
				for i := range uint32(16) {
					_, consumed := d.ConsumesCounters[0].Counters[MemorySliceCounter(i)]
					if in := i >= pl.Start && i < pl.End(); consumed != in {
						t.Errorf("%s (slices %d-%d) consumes memory slice %d: %v", name, pl.Start, pl.End()-1, i, consumed)
					}
					if _, ok := set.Counters[MemorySliceCounter(i)]; consumed && !ok {
						t.Errorf("%s consumes memory slice %d, which %s lacks", name, i, set.Name)
					}
				}
			}
		}
	}
	checkAPILimits(t, res.Devices)
	for i, s := range Split(res.Devices) {
		if len(s) > MaxDevicesPerSlice {
			t.Errorf("slice %d holds %d devices", i, len(s))
		}
	}
	if c := SplitCounters(res.CounterSets); len(c) != 1 {
		t.Errorf("counter sets in %d slices, want 1", len(c))
	}
	for _, set := range res.CounterSets {
		if len(set.Counters) > resourceapi.ResourceSliceMaxCountersPerCounterSet {
			t.Errorf("%s has %d counters", set.Name, len(set.Counters))
		}
	}

	// The three modes of a DGX H100, for the record.
	whole, _, wroot := onDemandNode(t, "dgx-h100")
	static, _, sroot := onDemandNode(t, "dgx-h100", staticMIG()...)
	staticRes, err := Build(static, Options{PCIeRoot: SysfsPCIeRoot(sroot)})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name string
		res  Result
	}{
		{"whole GPUs", buildOnDemand(t, whole, wroot, nil)},
		{"MIG, 7x 1g.10gb each (static)", staticRes},
		{"MIG on demand", res},
	} {
		t.Logf("DGX H100 GPUs (NICs aside), %s: %s", m.name, sliceSummary(m.res))
	}
	t.Logf("GPU 0 counter set: %s", counterText(res.CounterSets[0]))
	t.Logf("GPU 0 placements: %s", strings.Join(placementNames(res.Devices, 0), " "))
}

func staticMIG() []sim.ProfileOption {
	var out []sim.ProfileOption
	for i := range 8 {
		out = append(out, sim.WithMIG(i, repeat("1g.10gb", 7)...))
	}
	return out
}

// sliceSummary says how res is published: the slices, their devices by
// type, the counter sets.
func sliceSummary(res Result) string {
	var parts []string
	if c := SplitCounters(res.CounterSets); len(c) > 0 {
		parts = append(parts, fmt.Sprintf("%d counter slice (%d sets)", len(c), len(res.CounterSets)))
	}
	for i, s := range Split(res.Devices) {
		kinds := map[string]int{}
		for _, d := range s {
			k := str(d, AttrType)
			if len(d.ConsumesCounters) > 0 {
				k = "mig placement"
			}
			kinds[k]++
		}
		var ks []string
		for _, k := range []string{TypeGPU, TypeMIG, "mig placement", TypeNIC} {
			if kinds[k] > 0 {
				ks = append(ks, fmt.Sprintf("%d %s", kinds[k], k))
			}
		}
		parts = append(parts, fmt.Sprintf("slice %d: %s", i, strings.Join(ks, ", ")))
	}
	return fmt.Sprintf("%d devices; %s", len(res.Devices), strings.Join(parts, "; "))
}

func counterText(c resourceapi.CounterSet) string {
	var out []string
	for _, k := range sortedKeys(c.Counters) {
		v := c.Counters[k].Value
		out = append(out, k+"="+v.String())
	}
	return c.Name + " {" + strings.Join(out, " ") + "}"
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func placementNames(devs []resourceapi.Device, gpu int) []string {
	var out []string
	for _, d := range devs {
		if len(d.ConsumesCounters) > 0 && strings.HasPrefix(d.Name, GPUName(gpu)+"-") {
			out = append(out, d.Name)
		}
	}
	return out
}

// TestOnDemandAllocation runs the published placements through the
// scheduler's allocator, a claim at a time as pods arrive, on a DGX H100
// whose GPU 0 alone is in MIG mode: the layouts the GPU allows are
// allocated, and a claim that would need an occupied slice, or a second
// set of media extensions, is not.
func TestOnDemandAllocation(t *testing.T) {
	n, _, root := onDemandNode(t, "dgx-h100", sim.WithMIG(0))
	res := buildOnDemand(t, n, root, nil)
	rs := resourceSlices(res.Devices, res.CounterSets...)
	classes := chartClasses(t, false)
	var slots uint32
	for _, p := range n.GPUs[0].MIGProfiles {
		for _, pl := range p.Placements {
			slots = max(slots, pl.End())
		}
	}
	for _, tc := range []struct {
		name string
		// fits are profiles allocated one claim each, in order; then
		// refused is a profile no claim gets.
		fits    []string
		refused string
	}{
		{"seven 1g.10gb", repeat("1g.10gb", 7), "1g.10gb"},
		{"4g.40gb and 3g.40gb", []string{"4g.40gb", "3g.40gb"}, "1g.10gb"},
		{"7g.80gb", []string{"7g.80gb"}, "1g.10gb"},
		{"three 2g.20gb and a 1g.10gb", []string{"2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"}, "1g.10gb"},
		{"one set of media extensions", []string{"1g.10gb+me", "1g.10gb"}, "1g.10gb+me"},
		{"4g.40gb, then no 7g.80gb", []string{"4g.40gb"}, "7g.80gb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var held []string
			used := map[uint32]string{}
			for i, p := range append(slices.Clone(tc.fits), tc.refused) {
				claim := extendedClaim("mig-"+p+"."+DriverName, 1)
				claim.Name, claim.UID = fmt.Sprintf("c%d", i), types.UID("uid-"+claimUID(i))
				got := allocateSlices(t, rs, classes, nil, claim, held...)
				if i == len(tc.fits) {
					if got != nil {
						t.Fatalf("after %v, %s was allocated %v", tc.fits, p, got)
					}
					return
				}
				if len(got) != 1 {
					t.Fatalf("after %v, %s was not allocated", held, p)
				}
				d := byName(res.Devices)[got[0].Device]
				if str(d, AttrProfile) != p || !strings.HasPrefix(d.Name, GPUName(0)+"-") {
					t.Fatalf("%s allocated %s", p, d.Name)
				}
				for k := range slots {
					if _, ok := d.ConsumesCounters[0].Counters[MemorySliceCounter(k)]; ok {
						if other, taken := used[k]; taken {
							t.Fatalf("%s and %s both hold memory slice %d", other, d.Name, k)
						}
						used[k] = d.Name
					}
				}
				held = append(held, got[0].Device)
			}
		})
	}
}

func claimUID(i int) string { return fmt.Sprintf("%04d", i) }

// TestOnDemandExistingMIG: a MIG device that exists and was not made for a
// claim is published as it is and the placements it covers are not; one
// made for a claim is published as its placement, whose health is then
// the made device's.
func TestOnDemandExistingMIG(t *testing.T) {
	n, _, root := onDemandNode(t, "dgx-h100", sim.WithMIG(0, "3g.40gb"))
	g := n.GPUs[0]
	if len(g.MIG) != 1 || g.MIG[0].Placement.Size == 0 {
		t.Fatalf("GPU 0 MIG devices %+v, want one with its placement", g.MIG)
	}
	existing := g.MIG[0]
	res := buildOnDemand(t, n, root, nil)
	devs := byName(res.Devices)
	if _, ok := devs[MIGName(0, existing)]; !ok {
		t.Fatalf("the existing %s is not published", MIGName(0, existing))
	}
	for _, p := range g.MIGProfiles {
		for _, pl := range p.Placements {
			_, published := devs[PlacementName(0, p.Name, pl.Start)]
			if published == pl.Overlaps(existing.Placement) {
				t.Errorf("%s at %d-%d published %v beside the existing %s at %d-%d", p.Name, pl.Start, pl.End()-1, published,
					existing.Profile, existing.Placement.Start, existing.Placement.End()-1)
			}
		}
	}

	// The same device made for a claim: its placement stands for it.
	key := MadeSet{MIGKey{g.UUID, existing.Profile, existing.Placement.Start}: true}
	made := buildOnDemand(t, n, root, key)
	mdevs := byName(made.Devices)
	if _, ok := mdevs[MIGName(0, existing)]; ok {
		t.Errorf("a made device is published under its own name too")
	}
	name := PlacementName(0, existing.Profile, existing.Placement.Start)
	i := slices.IndexFunc(made.Devices, func(d resourceapi.Device) bool { return d.Name == name })
	if i < 0 {
		t.Fatalf("%s not published", name)
	}
	if made.IDs[i] != existing.UUID {
		t.Errorf("%s has health ID %s, want the made %s", name, made.IDs[i], existing.UUID)
	}
	tainted, err := Build(n, Options{PCIeRoot: SysfsPCIeRoot(root), OnDemandMIG: true, Made: key,
		Unhealthy: map[string]Fault{existing.UUID: {Cause: "xid-79"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range tainted.Devices {
		if bad := len(d.Taints) > 0; bad != (d.Name == name) {
			t.Errorf("%s tainted %v with the made device unhealthy", d.Name, bad)
		}
	}
}

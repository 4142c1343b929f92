package dra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fakeMaker stands in for the NVML owner: it "makes" a MIG device by
// handing out one the simulated node already has (so its device nodes
// and capability files exist), and records every call.
type fakeMaker struct {
	mu        sync.Mutex
	dev       topology.MIGDevice
	makeErr   error
	unmakeErr error
	makes     []string
	unmakes   []string
}

func (f *fakeMaker) MakeMIG(_ context.Context, parent string, profile int, at topology.MIGPlacement) (topology.MIGDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.makes = append(f.makes, placeKey(parent, profile, at))
	if f.makeErr != nil {
		return topology.MIGDevice{}, f.makeErr
	}
	return f.dev, nil
}

func (f *fakeMaker) UnmakeMIG(_ context.Context, parent string, profile int, at topology.MIGPlacement, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unmakes = append(f.unmakes, placeKey(parent, profile, at))
	return f.unmakeErr
}

func (f *fakeMaker) calls() (makes, unmakes []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.makes), slices.Clone(f.unmakes)
}

func (f *fakeMaker) set(makeErr, unmakeErr error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.makeErr, f.unmakeErr = makeErr, unmakeErr
}

func placeKey(parent string, profile int, at topology.MIGPlacement) string {
	return strings.Join([]string{parent, string(rune('0' + profile)), string(rune('0' + at.Start)), string(rune('0' + at.Size))}, "/")
}

// onDemandEnv is a DGX A100 whose GPU 1 is in MIG mode with one 1g.5gb
// device (what the fake maker hands out) and offers the 1g.5gb profile
// at its seven placements.
func onDemandEnv(t *testing.T) (*testEnv, *fakeMaker, string) {
	t.Helper()
	node, _ := simNode(t, "dgx-a100", sim.WithMIG(1, "1g.5gb"))
	g := &node.GPUs[1]
	f := &fakeMaker{dev: g.MIG[0]}
	e := newEnvWith(t, "dgx-a100", f, sim.WithMIG(1, "1g.5gb"))
	g = &e.node.GPUs[1]
	f.dev = g.MIG[0]
	prof := topology.MIGProfile{Name: "1g.5gb", ID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, MemoryMiB: 4864,
		Attributes: topology.MIGAttributes{Multiprocessors: 14, GPUInstanceSlices: 1, ComputeInstanceSlices: 1, CopyEngines: 1}}
	for s := range uint32(7) {
		prof.Placements = append(prof.Placements, topology.MIGPlacement{Start: s, Size: 1})
	}
	g.MIGProfiles = []topology.MIGProfile{prof}
	return e, f, g.UUID
}

// newEnvWith is newEnv with a MIG maker.
func newEnvWith(t *testing.T, profile string, mig MIGMaker, opts ...sim.ProfileOption) *testEnv {
	t.Helper()
	e := newEnv(t, profile, opts...)
	e.plugin.Stop()
	e.mig = mig
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	return e
}

func readCP(t *testing.T, e *testEnv) checkpoint {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.state, CheckpointFileName))
	if err != nil {
		t.Fatal(err)
	}
	var cp checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}
	return cp
}

// TestPrepareMakesMIG: a claim for a placement device makes its MIG device
// (the placement's profile and slices on its parent), hands the container
// that device, checkpoints it, reuses it when the spec is lost, and
// destroys it on unprepare.
func TestPrepareMakesMIG(t *testing.T) {
	e, f, parent := onDemandEnv(t)
	c := e.kubelet()
	dev := PlacementName(1, "1g.5gb", 3)
	e.claims.put(allocated("ns", "mig", "uid-m", ours("mig", dev)))
	r := prepare(t, c, claimReq("ns", "mig", "uid-m"))["uid-m"]
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	want := placeKey(parent, nvml.GPU_INSTANCE_PROFILE_1_SLICE, topology.MIGPlacement{Start: 3, Size: 1})
	if makes, _ := f.calls(); !slices.Equal(makes, []string{want}) {
		t.Fatalf("makes %v, want %v", makes, want)
	}
	env, nodes := containerEdits(t, e.cdiDir, r.Devices[0].CdiDeviceIds)
	if env["NVIDIA_VISIBLE_DEVICES"] != f.dev.UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want the made %s", env["NVIDIA_VISIBLE_DEVICES"], f.dev.UUID)
	}
	if caps := slices.DeleteFunc(slices.Clone(nodes), func(p string) bool { return !strings.HasPrefix(p, "/dev/nvidia-caps/nvidia-cap") }); len(caps) != 2 {
		t.Errorf("device nodes %v: want the made device's GI and CI access caps", nodes)
	}
	cp := readCP(t, e)
	if m := cp.Claims["uid-m"].Devices[0].MIG; m == nil || m.UUID != f.dev.UUID || m.Parent != parent || m.Placement.Start != 3 || len(cp.Making) != 0 {
		t.Fatalf("checkpoint %+v: want the made device recorded and nothing being made", cp)
	}
	if made := e.plugin.prep.Made(); len(made) != 1 || !made[MIGKey{parent, "1g.5gb", 3}] {
		t.Errorf("Made() = %v, want the 1g.5gb at slice 3 of %s", made, parent)
	}

	// The spec is lost (a wiped /var/run): prepare again reuses the
	// checkpointed device instead of making a second one.
	if err := os.Remove(filepath.Join(e.cdiDir, SpecFile("uid-m"))); err != nil {
		t.Fatal(err)
	}
	if r := prepare(t, c, claimReq("ns", "mig", "uid-m"))["uid-m"]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if makes, _ := f.calls(); len(makes) != 1 {
		t.Errorf("re-prepare made again: %v", makes)
	}

	// Destroying fails: the claim stays prepared for the kubelet's retry.
	f.set(nil, nvml.ERROR_IN_USE)
	if r := unprepare(t, c, claimReq("ns", "mig", "uid-m"))["uid-m"]; !strings.Contains(r.Error, "ERROR_IN_USE") {
		t.Fatalf("unprepare with a failing destroy: error %q", r.Error)
	}
	if p := e.plugin.prep.Prepared(); !slices.Equal(p, []string{"uid-m"}) {
		t.Fatalf("after a failed destroy the checkpoint holds %v", p)
	}
	f.set(nil, nil)
	if r := unprepare(t, c, claimReq("ns", "mig", "uid-m"))["uid-m"]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if _, unmakes := f.calls(); len(unmakes) != 2 || unmakes[1] != want {
		t.Errorf("unmakes %v, want two of %s", unmakes, want)
	}
	if p := e.plugin.prep.Prepared(); len(p) != 0 {
		t.Errorf("checkpoint holds %v after unprepare", p)
	}
}

// TestPrepareMIGFailures: a make that fails fails only its claim and
// leaves nothing recorded; a claim that fails after its MIG device was
// made destroys it again; a MIG device a crash left being made is
// destroyed by the next call.
func TestPrepareMIGFailures(t *testing.T) {
	e, f, parent := onDemandEnv(t)
	c := e.kubelet()
	f.set(nvml.ERROR_INSUFFICIENT_RESOURCES, nil)
	e.claims.put(allocated("ns", "full", "uid-f", ours("mig", PlacementName(1, "1g.5gb", 0))))
	if r := prepare(t, c, claimReq("ns", "full", "uid-f"))["uid-f"]; !strings.Contains(r.Error, "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("make failing: error %q", r.Error)
	}
	if cp := readCP(t, e); len(cp.Claims) != 0 || len(cp.Making) != 0 {
		t.Fatalf("checkpoint after a failed make: %+v", cp)
	}
	if _, unmakes := f.calls(); len(unmakes) != 0 {
		t.Errorf("nothing was made, yet destroyed %v", unmakes)
	}

	// The MIG device is made, then the claim's next device is not on the
	// node: the claim fails and the device is destroyed.
	f.set(nil, nil)
	e.claims.put(allocated("ns", "half", "uid-h", ours("mig", PlacementName(1, "1g.5gb", 2)), ours("gpu", "gpu-42")))
	if r := prepare(t, c, claimReq("ns", "half", "uid-h"))["uid-h"]; !strings.Contains(r.Error, "gpu-42") {
		t.Fatalf("claim with a missing device: error %q", r.Error)
	}
	want := placeKey(parent, nvml.GPU_INSTANCE_PROFILE_1_SLICE, topology.MIGPlacement{Start: 2, Size: 1})
	if _, unmakes := f.calls(); !slices.Equal(unmakes, []string{want}) {
		t.Errorf("destroyed %v, want the device made for the failed claim, %s", unmakes, want)
	}
	if cp := readCP(t, e); len(cp.Claims) != 0 || len(cp.Making) != 0 {
		t.Fatalf("checkpoint after a rolled-back claim: %+v", cp)
	}

	// A crash between the make and the checkpoint leaves the device in
	// "making": the next call (after a restart) destroys it.
	e.plugin.Stop()
	crashed := MIGPlace{Parent: parent, Profile: "1g.5gb", ProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, Placement: topology.MIGPlacement{Start: 5, Size: 1}}
	cp := readCP(t, e)
	cp.Making = []MIGPlace{crashed}
	if err := writeCheckpoint(filepath.Join(e.state, CheckpointFileName), &cp); err != nil {
		t.Fatal(err)
	}
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	// Until it is cleaned up, a device being made counts as made: a
	// discovery meanwhile must not publish it as a device of its own.
	if made := e.plugin.prep.Made(); !made[crashed.key()] {
		t.Errorf("Made() = %v lacks the device being made", made)
	}
	c = e.kubelet()
	if r := unprepare(t, c, claimReq("ns", "other", "uid-o"))["uid-o"]; r.Error != "" {
		t.Fatal(r.Error)
	}
	wantCrash := placeKey(parent, crashed.ProfileID, crashed.Placement)
	if _, unmakes := f.calls(); !slices.Contains(unmakes, wantCrash) {
		t.Errorf("destroyed %v, want the crashed make %s", unmakes, wantCrash)
	}
	if cp := readCP(t, e); len(cp.Making) != 0 {
		t.Errorf("making %v after the cleanup", cp.Making)
	}
}

// TestPrepareMIGWithoutMaker: a node that does not make MIG devices fails
// a claim for a placement device with a message saying so.
func TestPrepareMIGWithoutMaker(t *testing.T) {
	e := newEnv(t, "dgx-a100", sim.WithMIG(1, "1g.5gb"))
	p, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: e.root, CDIDir: e.cdiDir, StateDir: t.TempDir(),
		Inventory: func() Inventory {
			n := *e.node
			n.GPUs = slices.Clone(n.GPUs)
			n.GPUs[1].MIGProfiles = []topology.MIGProfile{{Name: "1g.5gb", Placements: []topology.MIGPlacement{{Start: 0, Size: 1}}}}
			return Inventory{Node: &n, OnDemandMIG: true}
		}})
	if err != nil {
		t.Fatal(err)
	}
	res := p.Prepare([]*resourceapi.ResourceClaim{allocated("ns", "m", "uid-x", ours("mig", PlacementName(1, "1g.5gb", 0)))})
	if err := res["uid-x"].Err; err == nil || !strings.Contains(err.Error(), "not made on demand") {
		t.Fatalf("error %v, want one saying MIG devices are not made on demand", err)
	}
}

// TestPrepareMakesMIGOnSimulator runs the Preparer against the NVML owner
// over a simulated DGX H100 whose GPU 0 is in MIG mode with no MIG
// device: a claim for a placement makes that MIG device on the GPU (its
// device nodes and NVIDIA_VISIBLE_DEVICES in the claim's CDI spec), a
// second claim beside it makes another, a claim for an occupied place
// fails cleanly, a failing compute-instance create leaves nothing, and
// unpreparing destroys what was made.
func TestPrepareMakesMIGOnSimulator(t *testing.T) {
	n, node, root := onDemandNode(t, "dgx-h100", sim.WithMIG(0))
	o := nvmlowner.New(node.NVML(), nvmlowner.Config{}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	p, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: root, CDIDir: cdiDir, StateDir: t.TempDir(),
		Inventory: func() Inventory { return Inventory{Node: n, OnDemandMIG: true} }, MIG: o})
	if err != nil {
		t.Fatal(err)
	}
	gpu0 := func() []topology.MIGDevice { return node.Spec().GPUs[0].MIG }
	prep := func(uid, dev string) PrepareResult {
		t.Helper()
		return p.Prepare([]*resourceapi.ResourceClaim{allocated("ns", uid, uid, ours("mig", dev))})[uid]
	}

	r := prep("uid-3g", PlacementName(0, "3g.40gb", 4))
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	made := gpu0()
	if len(made) != 1 || made[0].Profile != "3g.40gb" || made[0].Placement.Start != 4 {
		t.Fatalf("GPU 0 MIG devices %+v, want one 3g.40gb at slice 4", made)
	}
	env, nodes := containerEdits(t, cdiDir, r.Devices[0].CDIDeviceIDs)
	if env["NVIDIA_VISIBLE_DEVICES"] != made[0].UUID {
		t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want the made %s", env["NVIDIA_VISIBLE_DEVICES"], made[0].UUID)
	}
	if caps := slices.DeleteFunc(slices.Clone(nodes), func(p string) bool { return !strings.HasPrefix(p, "/dev/nvidia-caps/nvidia-cap") }); len(caps) != 2 {
		t.Errorf("device nodes %v: want the made device's GI and CI access caps", nodes)
	}

	if r := prep("uid-4g", PlacementName(0, "4g.40gb", 0)); r.Err != nil {
		t.Fatal(r.Err)
	}
	if len(gpu0()) != 2 {
		t.Fatalf("GPU 0 MIG devices %+v, want the 3g and the 4g", gpu0())
	}
	// Slice 5 is the 3g device's: the agent refuses, whatever a
	// scheduler that ignored the counters asked.
	if r := prep("uid-1g", PlacementName(0, "1g.10gb", 5)); r.Err == nil || !strings.Contains(r.Err.Error(), "ERROR_INSUFFICIENT_RESOURCES") {
		t.Fatalf("claim for an occupied slice: %v", r.Err)
	}
	if len(gpu0()) != 2 {
		t.Errorf("a refused claim changed GPU 0: %+v", gpu0())
	}
	for _, uid := range []string{"uid-3g", "uid-4g"} {
		if err := p.Unprepare([]ClaimRef{{Namespace: "ns", Name: uid, UID: uid}})[uid]; err != nil {
			t.Fatal(err)
		}
	}
	if left := gpu0(); len(left) != 0 {
		t.Fatalf("after unprepare GPU 0 still has %+v", left)
	}

	// The compute instance cannot be made: the GPU instance made before
	// it is destroyed again, and the claim fails.
	if err := node.InjectFault(sim.Fault{Kind: sim.FaultMIGCreateFails, GPU: 0, Call: "CreateComputeInstance", Ret: "ERROR_UNKNOWN"}); err != nil {
		t.Fatal(err)
	}
	if r := prep("uid-7g", PlacementName(0, "7g.80gb", 0)); r.Err == nil || !strings.Contains(r.Err.Error(), "ERROR_UNKNOWN") {
		t.Fatalf("claim with a failing compute instance: %v", r.Err)
	}
	if err := node.ClearFault(sim.Fault{Kind: sim.FaultMIGCreateFails, GPU: 0}); err != nil {
		t.Fatal(err)
	}
	if r := prep("uid-7g", PlacementName(0, "7g.80gb", 0)); r.Err != nil {
		t.Fatalf("after the fault, the 7g placement is free: %v", r.Err)
	}
	if left := gpu0(); len(left) != 1 || left[0].Profile != "7g.80gb" {
		t.Fatalf("GPU 0 MIG devices %+v, want the 7g alone", left)
	}
}

// TestPrepareMIGMaybeMade: a make whose outcome is unknown (a hung GPU)
// fails the claim but keeps the place as being made, so the next call
// destroys whatever it left; a MIG device the checkpoint names but the
// node no longer has (a reboot destroyed it) is made anew.
func TestPrepareMIGMaybeMade(t *testing.T) {
	e, f, parent := onDemandEnv(t)
	c := e.kubelet()
	f.set(fmt.Errorf("make: %w", nvmlowner.ErrMaybeMade), nil)
	e.claims.put(allocated("ns", "hung", "uid-h", ours("mig", PlacementName(1, "1g.5gb", 4))))
	if r := prepare(t, c, claimReq("ns", "hung", "uid-h"))["uid-h"]; r.Error == "" {
		t.Fatal("a make of unknown outcome succeeded")
	}
	place := MIGPlace{Parent: parent, Profile: "1g.5gb", ProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, Placement: topology.MIGPlacement{Start: 4, Size: 1}}
	if cp := readCP(t, e); !slices.Equal(cp.Making, []MIGPlace{place}) {
		t.Fatalf("making %v, want %v kept", cp.Making, place)
	}
	f.set(nil, nil)
	if r := prepare(t, c, claimReq("ns", "hung", "uid-h"))["uid-h"]; r.Error != "" {
		t.Fatal(r.Error)
	}
	want := placeKey(parent, place.ProfileID, place.Placement)
	if makes, unmakes := f.calls(); !slices.Equal(unmakes, []string{want}) || len(makes) != 2 {
		t.Errorf("makes %v, unmakes %v: want the half-made device destroyed before the second make", makes, unmakes)
	}
	if cp := readCP(t, e); len(cp.Making) != 0 {
		t.Errorf("making %v after the claim was prepared", cp.Making)
	}

	// The spec is lost and so is the MIG device (the node was rebooted):
	// preparing again makes a new one.
	if err := os.Remove(filepath.Join(e.cdiDir, SpecFile("uid-h"))); err != nil {
		t.Fatal(err)
	}
	e.plugin.Stop()
	rebooted := *e.node
	rebooted.GPUs = slices.Clone(e.node.GPUs)
	rebooted.GPUs[1].MIG = nil
	p, err := NewPreparer(PreparerConfig{NodeName: testNode, HostRoot: e.root, CDIDir: e.cdiDir, StateDir: e.state,
		Inventory: func() Inventory { return Inventory{Node: &rebooted, OnDemandMIG: true} }, MIG: f})
	if err != nil {
		t.Fatal(err)
	}
	claim := allocated("ns", "hung", "uid-h", ours("mig", PlacementName(1, "1g.5gb", 4)))
	if r := p.Prepare([]*resourceapi.ResourceClaim{claim})["uid-h"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if makes, _ := f.calls(); len(makes) != 3 {
		t.Errorf("makes %v: want a third for the device the node lost", makes)
	}
}

// TestOnDemandWithoutProfiles: when a discovery could not read a GPU's
// MIG profiles, its MIG devices are published as they are, except those
// made for claims, which are never offered to another claim.
func TestOnDemandWithoutProfiles(t *testing.T) {
	n, _, root := onDemandNode(t, "dgx-h100", sim.WithMIG(0, "3g.40gb", "1g.10gb"))
	g := &n.GPUs[0]
	g.MIGProfiles = nil
	madeDev := g.MIG[0]
	res := buildOnDemand(t, n, root, MadeSet{MIGKey{g.UUID, madeDev.Profile, madeDev.Placement.Start}: true})
	devs := byName(res.Devices)
	if _, ok := devs[MIGName(0, madeDev)]; ok {
		t.Errorf("the made %s is offered under its own name", MIGName(0, madeDev))
	}
	if _, ok := devs[MIGName(0, g.MIG[1])]; !ok {
		t.Errorf("the operator's %s is not published", MIGName(0, g.MIG[1]))
	}
	if len(res.CounterSets) != 0 {
		t.Errorf("counter sets %v without profiles", res.CounterSets)
	}
}

package agent

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// splitHarness is an apiSplit with scripted holders and recorded Events.
type splitHarness struct {
	*apiSplit
	dp, dra map[string][]string
	dpErr   error
	events  []string
}

func newSplitHarness(t *testing.T, path string, prev map[string]bool, want ...string) *splitHarness {
	t.Helper()
	s, err := newAPISplit(path, prev, want, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := &splitHarness{apiSplit: s, dp: map[string][]string{}, dra: map[string][]string{}}
	s.dpHolders = func(k string) ([]string, error) { return h.dp[k], h.dpErr }
	s.draHolders = func(k string) ([]string, error) { return h.dra[k], nil }
	s.event = func(typ, reason, msg string) { h.events = append(h.events, typ+" "+reason+": "+msg) }
	return h
}

func (h *splitHarness) kinds() []string { return slices.Sorted(maps.Keys(h.draKinds())) }

func (h *splitHarness) blockedGauge(kind string) float64 {
	return testutil.ToFloat64(h.blocked.WithLabelValues(kind))
}

func TestAPISplitMovesFreeKindsAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), ServedFileName)
	h := newSplitHarness(t, path, map[string]bool{}, "gpu", "mig")
	h.step(true)
	if got := h.kinds(); !slices.Equal(got, []string{"gpu", "mig"}) {
		t.Fatalf("dra kinds = %v, want [gpu mig]", got)
	}
	if h.dpServes("gpu") || h.dpServes("mig") || !h.dpServes("nic") {
		t.Fatalf("device plugin serves gpu %v mig %v nic %v, want only nic", h.dpServes("gpu"), h.dpServes("mig"), h.dpServes("nic"))
	}
	if h.pending() {
		t.Error("still pending after a free move")
	}
	if len(h.events) != 0 {
		t.Errorf("events at start: %v", h.events)
	}
	// The record is what a restart reads back.
	got, err := readServed(path)
	if err != nil || !maps.Equal(got, map[string]bool{"gpu": true, "mig": true}) {
		t.Fatalf("readServed = %v, %v", got, err)
	}
	select {
	case <-h.changed:
	default:
		t.Error("no change signalled")
	}
}

func TestAPISplitRefusesWhileHeldThenMovesInTwoSteps(t *testing.T) {
	path := filepath.Join(t.TempDir(), ServedFileName)
	h := newSplitHarness(t, path, map[string]bool{}, "nic")
	h.dp["nic"] = []string{"pod p1 container c: mlx5_0 (rdma/ib)"}
	h.step(true)
	if len(h.kinds()) != 0 || !h.dpServes("nic") {
		t.Fatalf("nic moved while held: dra %v", h.kinds())
	}
	if h.blockedGauge("nic") != 1 || h.blockedGauge("gpu") != 0 {
		t.Errorf("blocked gauge nic %v gpu %v, want 1 and 0", h.blockedGauge("nic"), h.blockedGauge("gpu"))
	}
	if len(h.events) != 1 || !strings.Contains(h.events[0], "Warning DeviceAPISwitchRefused: nic devices stay with the device plugin, not DRA as configured, while held through it: pod p1 container c: mlx5_0 (rdma/ib)") {
		t.Fatalf("events = %v", h.events)
	}
	// Retries while still held post no further Event.
	h.step(false)
	if len(h.events) != 1 {
		t.Fatalf("events after a retry = %v", h.events)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record written for a refused move: %v", err)
	}

	// Freed: first withdrawn from the device plugin, offered by neither.
	delete(h.dp, "nic")
	h.step(false)
	if h.dpServes("nic") || len(h.kinds()) != 0 || !h.pending() {
		t.Fatalf("after the first step: dp %v dra %v pending %v, want withdrawn from both", h.dpServes("nic"), h.kinds(), h.pending())
	}
	if h.blockedGauge("nic") != 0 {
		t.Error("still blocked once free")
	}
	// Still free an interval later: offered through DRA.
	h.step(false)
	if got := h.kinds(); !slices.Equal(got, []string{"nic"}) || h.dpServes("nic") || h.pending() {
		t.Fatalf("after the second step: dra %v dp %v pending %v", got, h.dpServes("nic"), h.pending())
	}
	if len(h.events) != 2 || h.events[1] != "Normal DeviceAPISwitched: nic devices are now served through DRA" {
		t.Fatalf("events = %v", h.events)
	}
	if got, err := readServed(path); err != nil || !maps.Equal(got, map[string]bool{"nic": true}) {
		t.Fatalf("readServed = %v, %v", got, err)
	}
}

func TestAPISplitAllocationRacingTheWithdrawalSendsItBack(t *testing.T) {
	h := newSplitHarness(t, "", map[string]bool{}, "gpu", "mig")
	h.dp["gpu"] = []string{"pod p1 container c: GPU-1 (nvidia.com/gpu)"}
	h.step(true)
	delete(h.dp, "gpu")
	h.step(false) // gpu withdrawn; mig moved at start already
	if h.dpServes("gpu") {
		t.Fatal("gpu not withdrawn")
	}
	// The kubelet allocated one through the device plugin just before.
	h.dp["gpu"] = []string{"pod p2 container c: GPU-2 (nvidia.com/gpu)"}
	h.step(false)
	if !h.dpServes("gpu") || slices.Contains(h.kinds(), "gpu") {
		t.Fatalf("gpu not given back to the device plugin: dra %v", h.kinds())
	}
	if h.blockedGauge("gpu") != 1 {
		t.Error("not blocked")
	}
}

func TestAPISplitBackToDevicePluginWaitsForPreparedClaims(t *testing.T) {
	path := filepath.Join(t.TempDir(), ServedFileName)
	h := newSplitHarness(t, path, map[string]bool{"gpu": true, "mig": true, "nic": true}, "nic")
	h.dra["gpu"] = []string{"claim default/c1: gpu-3"}
	h.step(true)
	// mig moves back at once; gpu stays with DRA while the claim is
	// prepared; nic stays where it is wanted.
	if got := h.kinds(); !slices.Equal(got, []string{"gpu", "nic"}) {
		t.Fatalf("dra kinds = %v, want [gpu nic]", got)
	}
	if !h.active() {
		t.Error("not active while DRA serves kinds")
	}
	if len(h.events) != 1 || !strings.Contains(h.events[0], "gpu devices stay with DRA, not the device plugin as configured, while held through it: claim default/c1: gpu-3") {
		t.Fatalf("events = %v", h.events)
	}
	delete(h.dra, "gpu")
	h.step(false)
	h.step(false)
	if got := h.kinds(); !slices.Equal(got, []string{"nic"}) || !h.dpServes("gpu") {
		t.Fatalf("dra kinds = %v, dp gpu %v", got, h.dpServes("gpu"))
	}
	if got, err := readServed(path); err != nil || !maps.Equal(got, map[string]bool{"nic": true}) {
		t.Fatalf("readServed = %v, %v", got, err)
	}
}

func TestAPISplitUnknownHoldersBlock(t *testing.T) {
	h := newSplitHarness(t, "", map[string]bool{}, "nic")
	h.dpErr = errors.New("kubelet device checkpoint: unexpected end of JSON input")
	h.step(true)
	if !h.dpServes("nic") || len(h.events) != 1 || !strings.Contains(h.events[0], "unknown: kubelet device checkpoint: unexpected end of JSON input") {
		t.Fatalf("dp nic %v events %v", h.dpServes("nic"), h.events)
	}
}

func TestAPISplitInactive(t *testing.T) {
	h := newSplitHarness(t, "", map[string]bool{})
	if h.active() || h.pending() {
		t.Fatal("active or pending with nothing for DRA")
	}
	for _, k := range allKinds() {
		if !h.dpServes(k) {
			t.Errorf("device plugin does not serve %s", k)
		}
	}
}

func TestReadServed(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got, err := readServed(filepath.Join(dir, "none.json")); err != nil || len(got) != 0 {
		t.Fatalf("missing file: %v, %v", got, err)
	}
	if got, err := readServed(write("ok.json", `{"version":1,"dra":["nic"]}`)); err != nil || !maps.Equal(got, map[string]bool{"nic": true}) {
		t.Fatalf("good file: %v, %v", got, err)
	}
	for name, tc := range map[string]struct{ content, wantErr string }{
		"corrupt":      {`{"version":1,"dra":[`, "is corrupt (remove it only if no pod on this node holds a device through DRA)"},
		"version":      {`{"version":2,"dra":[]}`, "has version 2, this agent reads 1"},
		"unknown kind": {`{"version":1,"dra":["tpu"]}`, `unknown device kind "tpu"`},
	} {
		p := write(name+".json", tc.content)
		if _, err := readServed(p); err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: error = %v, want one naming %s and containing %q", name, err, p, tc.wantErr)
		}
	}
}

func TestDPKindOf(t *testing.T) {
	for _, tc := range []struct{ resource, id, want string }{
		{"nvidia.com/gpu", "GPU-9b8c7d6e-0000-1111-2222-333344445555", "gpu"},
		{"nvidia.com/gpu", "GPU-9b8c7d6e-0000-1111-2222-333344445555::3", "gpu"},
		{"nvidia.com/gpu", "MIG-4f3e2d1c-aaaa-bbbb-cccc-ddddeeeeffff", "mig"}, // MIG single strategy
		{"nvidia.com/mig-1g.10gb", "MIG-GPU-9b8c7d6e-0000-1111-2222-333344445555/7/0", "mig"},
		{"rdma/ib", "mlx5_0", "nic"},
		{"example.com/fpga", "fpga0", ""},
	} {
		if got := dpKindOf(tc.resource, tc.id); got != tc.want {
			t.Errorf("dpKindOf(%q, %q) = %q, want %q", tc.resource, tc.id, got, tc.want)
		}
	}
}

// TestKubeletHolders reads a device-manager checkpoint as the kubelet
// writes it (pkg/kubelet/cm/devicemanager/checkpoint: DeviceIDs by NUMA
// node) and counts only the pods whose log directories still exist.
func TestKubeletHolders(t *testing.T) {
	dpDir, root := t.TempDir(), t.TempDir()
	const running, deleted = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
	cp := `{"Data":{"PodDeviceEntries":[
 {"PodUID":"` + running + `","ContainerName":"train","ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["GPU-aaaa"]},"AllocResp":""},
 {"PodUID":"` + running + `","ContainerName":"train","ResourceName":"rdma/ib","DeviceIDs":{"0":["mlx5_0"]},"AllocResp":""},
 {"PodUID":"` + deleted + `","ContainerName":"old","ResourceName":"nvidia.com/mig-1g.10gb","DeviceIDs":{"-1":["MIG-bbbb"]},"AllocResp":""}],
 "RegisteredDevices":{"nvidia.com/gpu":["GPU-aaaa"]}},"Checksum":1}`
	if err := os.WriteFile(filepath.Join(dpDir, "kubelet_internal_checkpoint"), []byte(cp), 0o600); err != nil {
		t.Fatal(err)
	}
	held := kubeletHolders(dpDir, root)
	// No pod log directories: every entry counts.
	if got, err := held("mig"); err != nil || len(got) != 1 {
		t.Fatalf("mig without log dirs = %v, %v; want the deleted pod's entry", got, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "var/log/pods", "default_trainer_"+running), 0o755); err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string][]string{
		"gpu": {"pod " + running + " container train: GPU-aaaa (nvidia.com/gpu)"},
		"nic": {"pod " + running + " container train: mlx5_0 (rdma/ib)"},
		"mig": nil,
	} {
		got, err := held(kind)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %q, %v; want %q", kind, got, err, want)
		}
	}
	if got, err := kubeletHolders(t.TempDir(), root)("gpu"); err != nil || got != nil {
		t.Errorf("no checkpoint: %v, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dpDir, "kubelet_internal_checkpoint"), []byte(cp[:40]), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := held("gpu"); err == nil {
		t.Error("a cut-short checkpoint is no error")
	}
}

type idResource struct {
	name string
	ids  []string
}

func (r idResource) Name() string { return r.name }
func (r idResource) Devices() []plugin.Device {
	var out []plugin.Device
	for _, id := range r.ids {
		out = append(out, plugin.Device{ID: id, Healthy: true})
	}
	return out
}
func (r idResource) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return nil, errors.New("not allocatable")
}

func TestDevicePluginResourcesFollowTheSplit(t *testing.T) {
	h := newSplitHarness(t, "", map[string]bool{}, "mig", "nic")
	h.step(true)
	a := &Agent{split: h.apiSplit}
	rs := []plugin.Resource{
		idResource{"nvidia.com/gpu", []string{"GPU-1", "GPU-2::0"}},
		idResource{"nvidia.com/mig-1g.10gb", []string{"MIG-1"}},
		idResource{"nvidia.com/mig-7g.80gb", nil},
		idResource{"rdma/ib", []string{"mlx5_0"}},
	}
	var names []string
	for _, r := range a.devicePluginResources(rs) {
		names = append(names, r.Name())
	}
	// An empty MIG resource goes by its name.
	if want := []string{"nvidia.com/gpu"}; !slices.Equal(names, want) {
		t.Fatalf("device plugin serves %v, want %v", names, want)
	}
}

// TestFaultOf: a device taint names the status's causes; NoExecute only
// for a node-wide fault with dra.noExecute.
func TestFaultOf(t *testing.T) {
	for _, tc := range []struct {
		name      string
		st        health.Status
		noExecute bool
		want      dra.Fault
	}{
		{"one cause", health.Status{Causes: []string{"xid-79"}}, true, dra.Fault{Cause: "xid-79"}},
		{"several causes", health.Status{Causes: []string{"recovery-action", "xid-79"}}, false, dra.Fault{Cause: "recovery-action.xid-79"}},
		{"no cause code", health.Status{}, false, dra.Fault{Cause: "unhealthy"}},
		{"node-wide, configured", health.Status{Causes: []string{"nvml-poll"}, NodeWide: true}, true, dra.Fault{Cause: "nvml-poll", Effect: resourceapi.DeviceTaintEffectNoExecute}},
		{"node-wide, not configured", health.Status{Causes: []string{"nvml-poll"}, NodeWide: true}, false, dra.Fault{Cause: "nvml-poll"}},
	} {
		if got := faultOf(tc.st, tc.noExecute); got != tc.want {
			t.Errorf("%s: faultOf = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

package health

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// testNodeModel is two GPUs, the second with two MIG devices.
func testNodeModel() *topology.Node {
	return &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0"},
		{Index: 1, UUID: "GPU-1", MIGEnabled: true, MIG: []topology.MIGDevice{
			{UUID: "MIG-1-a", GPUInstance: 1}, {UUID: "MIG-1-b", GPUInstance: 2},
		}},
	}}
}

// hostRoot makes a host root whose boot ID is id.
func hostRoot(t *testing.T, id string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "proc/sys/kernel/random")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "boot_id"), []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// newStateMonitor builds a monitor persisting to dir on clk, without Run
// (Observe and evaluate drive it) and without SetNode.
func newStateMonitor(t *testing.T, dir, root string, clk *clocktesting.FakeClock) (*Monitor, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(Config{StateDir: dir, HostRoot: root, DCGMMode: DCGMOff, clock: clk}, ownerOf(newFakeNVML(2)), discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

func readState(t *testing.T, dir string) stateFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var f stateFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	root := hostRoot(t, "boot-a")
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, dir, root, clk)
	m.SetNode(testNodeModel())
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79", XID: 79})
	m.Observe(Observation{DeviceID: "GPU-1", Check: CheckRemap, Key: "pending", Fatal: true, Reason: "row remapping pending"})
	m.Observe(Observation{DeviceID: "mlx5_0", Kind: KindNIC, Check: "rdma-port", Fatal: true, Reason: "port down"})
	// A flap on MIG-1-b: an event, recovered, and again within the window.
	m.Observe(Observation{DeviceID: "MIG-1-b", Check: CheckXID, Key: "xid 147", Fatal: true, Event: true, Reason: "xid 147", XID: 147})
	clk.Step(5 * time.Minute)
	m.evaluate()
	m.Observe(Observation{DeviceID: "MIG-1-b", Check: CheckXID, Key: "xid 147", Fatal: true, Event: true, Reason: "xid 147", XID: 147})
	m.SetBaseline("GPU-0", "ecc-dbe-volatile", 3)
	want := m.Snapshot()
	if want["MIG-1-b"].Flaps != 1 {
		t.Fatalf("setup: MIG-1-b flaps %d, want 1", want["MIG-1-b"].Flaps)
	}

	// Restart: a new monitor on the same dir, before any SetNode.
	m2, _ := newStateMonitor(t, dir, root, clk)
	for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-b", "mlx5_0"} {
		if m2.Healthy(id) {
			t.Errorf("%s healthy on the first call after a restart", id)
		}
	}
	if f := m2.Fitness(); f.Fit || !slices.Contains(f.Devices, "GPU-0") {
		t.Fatalf("fitness after restart %+v", f)
	}
	m2.SetNode(testNodeModel())
	got := m2.Snapshot()
	for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-b", "mlx5_0"} {
		if !slices.Equal(got[id].Reasons, want[id].Reasons) || got[id].Flaps != want[id].Flaps || got[id].Healthy != want[id].Healthy {
			t.Errorf("%s after restart %+v, want %+v", id, got[id], want[id])
		}
	}
	if v, ok := m2.Baseline("GPU-0", "ecc-dbe-volatile"); !ok || v != 3 {
		t.Errorf("baseline after restart = %d, %v; want 3", v, ok)
	}
	// The held XID 79 still holds past the recovery period.
	clk.Step(time.Hour)
	m2.evaluate()
	if m2.Healthy("GPU-0") {
		t.Fatal("held xid 79 recovered after a restart without a reset")
	}
	// The flap still damps MIG-1-b's recovery (10m, not 5m, from its event).
	if m2.Status("MIG-1-b").Flaps != 1 {
		t.Fatalf("MIG-1-b flaps %d after restart", m2.Status("MIG-1-b").Flaps)
	}
	if f := readState(t, dir); f.Version != stateVersion || f.BootID != "boot-a" {
		t.Fatalf("state file version %d bootID %q", f.Version, f.BootID)
	}
}

// TestStateSetNodePrunesAfterRestore: states restored for GPUs that are
// gone survive until the first SetNode, which drops them.
func TestStateSetNodePrunesAfterRestore(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, dir, "", clk)
	m.SetNode(testNodeModel())
	m.Observe(Observation{DeviceID: "GPU-1", Check: CheckRemap, Fatal: true, Reason: "row remapping pending"})
	m.SetBaseline("GPU-1", "x", 1)

	m2, _ := newStateMonitor(t, dir, "", clk)
	if _, ok := m2.Snapshot()["GPU-1"]; !ok {
		t.Fatal("restored GPU-1 dropped before the first SetNode")
	}
	n := testNodeModel()
	n.GPUs = n.GPUs[:1]
	m2.SetNode(n)
	if _, ok := m2.Snapshot()["GPU-1"]; ok {
		t.Fatal("GPU-1 kept after SetNode without it")
	}
	if _, ok := m2.Baseline("GPU-1", "x"); ok {
		t.Fatal("baseline of a gone GPU kept")
	}
	if f := readState(t, dir); len(f.Devices) != 0 || len(f.Baselines) != 0 {
		t.Fatalf("state file still has gone devices: %+v", f)
	}
}

func TestStateUnusableFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
	}{
		{"corrupt json", `{"version": 1, "devices": {`},
		{"unknown version", `{"version": 99, "devices": {}}`},
		{"device without kind", `{"version": 1, "devices": {"GPU-0": {"healthy": true}}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, StateFileName), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			clk := clocktesting.NewFakeClock(t0)
			m, _ := newStateMonitor(t, dir, "", clk)
			aside := filepath.Join(dir, StateFileName+".corrupt-"+strconv.FormatInt(t0.Unix(), 10))
			if b, err := os.ReadFile(aside); err != nil || string(b) != tc.content {
				t.Fatalf("unusable file not set aside as %s: %v", aside, err)
			}
			f := m.Fitness()
			if f.Fit || f.Reason != CheckState || f.NodeWide {
				t.Fatalf("fitness %+v, want unfit for %q, not node-wide", f, CheckState)
			}
			m.SetNode(testNodeModel())
			for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-a"} {
				if m.Healthy(id) {
					t.Errorf("%s healthy before verification", id)
				}
			}
			if r := m.Status("GPU-0").Reasons; len(r) != 1 || !strings.Contains(r[0], stateUnreadable) {
				t.Fatalf("GPU-0 reasons %q", r)
			}
			// Still failing closed long after, and after a restart.
			clk.Step(24 * time.Hour)
			m.evaluate()
			m2, _ := newStateMonitor(t, dir, "", clk)
			m2.SetNode(testNodeModel())
			for _, mon := range []*Monitor{m, m2} {
				if mon.Healthy("GPU-0") {
					t.Fatal("GPU-0 healthy before Verified")
				}
				mon.Verified()
				if !mon.Healthy("GPU-0") || !mon.Healthy("MIG-1-a") {
					t.Fatalf("not healthy after Verified: %+v", mon.Snapshot())
				}
				if fit, r := mon.NodeFit(); !fit {
					t.Fatalf("node unfit after Verified: %v", r)
				}
			}
		})
	}
}

// TestStateVerifiedKeepsOtherNodeFaults: Verified removes only the state
// cause.
func TestStateVerifiedKeepsOtherNodeFaults(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, StateFileName), []byte("garbage"), 0o600)
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, dir, "", clk)
	m.SetNode(testNodeModel())
	m.Observe(Observation{DeviceID: NodeID, Check: CheckNVML, Fatal: true, Reason: "nvml init failed"})
	m.Verified()
	if m.Healthy("GPU-0") {
		t.Fatal("Verified cleared an NVML failure")
	}
	if f := m.Fitness(); !f.NodeWide || f.Reason != CheckNVML {
		t.Fatalf("fitness %+v, want node-wide nvml", f)
	}
	m.Verified() // no state cause left: a no-op
}

func TestStateBootIDChangeReleasesHolds(t *testing.T) {
	tests := []struct {
		name        string
		before, now string
		released    bool
	}{
		{"same boot", "boot-a", "boot-a", false},
		{"rebooted", "boot-a", "boot-b", true},
		{"boot ID unreadable now", "boot-a", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			clk := clocktesting.NewFakeClock(t0)
			m, _ := newStateMonitor(t, dir, hostRoot(t, tc.before), clk)
			m.SetNode(testNodeModel())
			m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79", XID: 79})
			m.Observe(Observation{DeviceID: NodeID, Check: "test", Fatal: true, Event: true, HoldUntilReset: true, Reason: "node hold"})
			clk.Step(time.Hour)
			root := t.TempDir()
			if tc.now != "" {
				root = hostRoot(t, tc.now)
			}
			m2, _ := newStateMonitor(t, dir, root, clk)
			m2.SetNode(testNodeModel())
			if m2.Healthy("GPU-0") {
				t.Fatal("healthy at once after restart; a released hold still waits out the recovery period")
			}
			clk.Step(5 * time.Minute)
			m2.evaluate()
			if got := m2.Healthy("GPU-0"); got != tc.released {
				t.Fatalf("GPU-0 healthy = %v 5m after restart, want %v (%+v)", got, tc.released, m2.Status("GPU-0"))
			}
		})
	}
}

func TestStateAtomicWrite(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(t0)
	m, reg := newStateMonitor(t, dir, "", clk)
	m.SetNode(testNodeModel())
	for i := range 20 {
		m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 48", Fatal: true, Event: true, Reason: "xid 48", XID: 48})
		clk.Step(time.Second)
		m.SetBaseline("GPU-0", "n", uint64(i))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != StateFileName {
		t.Fatalf("state dir holds %v, want only %s", entries, StateFileName)
	}
	if got := testutil.ToFloat64(m.persist.writeErrors); got != 0 {
		t.Fatalf("write errors %v", got)
	}
	// A failing write is counted and logged, not fatal, and leaves the
	// old file whole. (A state dir under a regular file fails even as
	// root, unlike a read-only one.)
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m.persist.dir = filepath.Join(blocker, "state")
	m.SetBaseline("GPU-0", "n", 1000)
	if got := testutil.ToFloat64(m.persist.writeErrors); got != 1 {
		t.Fatalf("write errors %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "gpu_node_agent_state_write_errors_total"); err != nil || n != 1 {
		t.Fatalf("metric series %d, %v", n, err)
	}
	if f := readState(t, dir); f.Baselines["GPU-0"]["n"] != 19 {
		t.Fatalf("old state file damaged: %+v", f.Baselines)
	}
}

func TestStateDisabled(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, "", "", clk)
	m.SetNode(testNodeModel())
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Fatal: true, Event: true, Reason: "xid 79", XID: 79})
	m.SetBaseline("GPU-0", "n", 1)
	if v, ok := m.Baseline("GPU-0", "n"); !ok || v != 1 {
		t.Fatalf("baseline %d %v without a state dir", v, ok)
	}
}

func TestClearFaults(t *testing.T) {
	xid79 := Observation{Check: CheckXID, Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79", XID: 79}
	event := Observation{Check: CheckXID, Key: "xid 147", Fatal: true, Event: true, Reason: "xid 147", XID: 147}
	lost := Observation{Check: CheckLost, Fatal: true, Reason: "gpu lost"}
	on := func(id string, o Observation) Observation { o.DeviceID = id; return o }
	tests := []struct {
		name        string
		obs         []Observation
		target      string
		wantErr     string
		wantCleared []string
		// healthy right after the clear, and a recovery period later
		healthyNow, healthyLater map[string]bool
	}{
		{name: "unknown uuid", target: "GPU-9", wantErr: `"GPU-9"`},
		{name: "empty target", target: "", wantErr: "unknown device"},
		{name: "held fault of a gpu: recovery starts", obs: []Observation{on("GPU-0", xid79)}, target: "GPU-0",
			wantCleared: []string{"GPU-0"},
			healthyNow:  map[string]bool{"GPU-0": false}, healthyLater: map[string]bool{"GPU-0": true}},
		{name: "gpu clear covers its MIG devices", obs: []Observation{on("MIG-1-a", xid79), on("GPU-0", xid79)}, target: "GPU-1",
			wantCleared: []string{"MIG-1-a"},
			healthyNow:  map[string]bool{"MIG-1-a": false}, healthyLater: map[string]bool{"MIG-1-a": true, "GPU-0": false}},
		{name: "event cause dropped at once", obs: []Observation{on("GPU-0", event)}, target: "GPU-0",
			wantCleared: []string{"GPU-0"}, healthyNow: map[string]bool{"GPU-0": true}},
		{name: "lasting cause stays", obs: []Observation{on("GPU-0", lost), on("GPU-0", xid79)}, target: "GPU-0",
			wantCleared: []string{"GPU-0"},
			healthyNow:  map[string]bool{"GPU-0": false}, healthyLater: map[string]bool{"GPU-0": false}},
		{name: "all", obs: []Observation{on("GPU-0", xid79), on("MIG-1-b", xid79), on(NodeID, Observation{Check: "x", Fatal: true, Event: true, HoldUntilReset: true, Reason: "node hold"})},
			target: "all", wantCleared: []string{"GPU-0", "MIG-1-b", NodeID},
			healthyLater: map[string]bool{"GPU-0": true, "MIG-1-b": true, "GPU-1": true}},
		{name: "known gpu with nothing to clear", target: "GPU-1", healthyNow: map[string]bool{"GPU-1": true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(t0)
			m, _ := newStateMonitor(t, t.TempDir(), "", clk)
			m.SetNode(testNodeModel())
			for _, o := range tc.obs {
				m.Observe(o)
			}
			clk.Step(time.Minute)
			m.evaluate()
			cleared, err := m.ClearFaults(tc.target)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(cleared, tc.wantCleared) {
				t.Fatalf("ClearFaults = %v, %v; want %v", cleared, err, tc.wantCleared)
			}
			m.evaluate()
			for id, want := range tc.healthyNow {
				if got := m.Healthy(id); got != want {
					t.Errorf("%s healthy = %v right after the clear, want %v (%+v)", id, got, want, m.Status(id))
				}
			}
			clk.Step(5 * time.Minute)
			m.evaluate()
			for id, want := range tc.healthyLater {
				if got := m.Healthy(id); got != want {
					t.Errorf("%s healthy = %v a recovery period after the clear, want %v (%+v)", id, got, want, m.Status(id))
				}
			}
		})
	}
}

// TestResetObservation: reset evidence releases the holds of its GPU and
// that GPU's MIG devices only, and starts their recovery period.
func TestResetObservation(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, t.TempDir(), "", clk)
	m.SetNode(testNodeModel())
	for _, id := range []string{"GPU-0", "GPU-1", "MIG-1-a"} {
		m.Observe(Observation{DeviceID: id, Check: CheckXID, Key: "xid 95", Fatal: true, Event: true, Reason: "xid 95", XID: 95})
	}
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckECC, Key: "dbe", Fatal: true, HoldUntilReset: true, Reason: "volatile DBE rose"})
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckECC, Key: "dbe", Cleared: true})
	clk.Step(time.Hour)
	m.evaluate()
	if m.Healthy("GPU-0") || m.Healthy("MIG-1-a") {
		t.Fatal("held faults recovered without a reset")
	}
	if r := m.Status("GPU-0").Reasons; !slices.Contains(r, "xid 95 (held until reset)") {
		t.Fatalf("GPU-0 reasons %q", r)
	}
	m.Observe(Observation{DeviceID: NodeID, Reset: true, Reason: "ignored"})
	m.Observe(Observation{DeviceID: "GPU-1", Reset: true, Reason: "volatile ECC counters dropped"})
	clk.Step(5 * time.Minute)
	m.evaluate()
	got := map[string]bool{"GPU-0": m.Healthy("GPU-0"), "GPU-1": m.Healthy("GPU-1"), "MIG-1-a": m.Healthy("MIG-1-a")}
	if got["GPU-0"] || !got["GPU-1"] || !got["MIG-1-a"] {
		t.Fatalf("after GPU-1 reset: %v, want GPU-1 and its MIG device healthy only", got)
	}
	if _, ok := m.Snapshot()["GPU-1"]; !ok {
		t.Fatal("GPU-1 missing from snapshot")
	}
	m.Observe(Observation{DeviceID: "GPU-0", Reset: true, Reason: "energy counter restarted"})
	clk.Step(5 * time.Minute)
	m.evaluate()
	if !m.Healthy("GPU-0") {
		t.Fatalf("GPU-0 not recovered after its reset: %+v", m.Status("GPU-0"))
	}
}

package remediate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// fakeHealth is the monitor: its remedies are set by the test.
type fakeHealth struct {
	mu       sync.Mutex
	remedies []health.Remedy
	observed []health.Observation
}

func (h *fakeHealth) Remedies() []health.Remedy {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.remedies)
}

func (h *fakeHealth) Observe(o health.Observation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observed = append(h.observed, o)
	if o.Reset {
		h.remedies = slices.DeleteFunc(h.remedies, func(r health.Remedy) bool { return r.GPU == o.DeviceID })
	}
}

func (h *fakeHealth) Subscribe() <-chan struct{} { return make(chan struct{}) }

func (h *fakeHealth) set(r ...health.Remedy) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.remedies = r
}

// fakeCluster records what the remediator asks of the API server.
type fakeCluster struct {
	paused     bool
	refuse     bool
	why        string // the refusal's words when set
	held       bool
	acquired   int
	released   int
	evictErr   error
	evicted    []string
	conditions map[string]bool
	events     []string
}

func newFakeCluster() *fakeCluster { return &fakeCluster{conditions: map[string]bool{}} }

func (c *fakeCluster) Paused(context.Context) (bool, error) { return c.paused, nil }
func (c *fakeCluster) AcquireSlot(context.Context) (bool, string, error) {
	if c.refuse {
		return false, cmp.Or(c.why, "1 of 1 slots are taken by other nodes (fleet size 3)"), nil
	}
	c.acquired++
	c.held = true
	return true, "", nil
}
func (c *fakeCluster) ReleaseSlot(context.Context) error { c.released++; c.held = false; return nil }
func (c *fakeCluster) Evict(_ context.Context, ns, name, uid string, grace *time.Duration) error {
	if c.evictErr != nil {
		return c.evictErr
	}
	g := "own"
	if grace != nil {
		g = grace.String()
	}
	c.evicted = append(c.evicted, fmt.Sprintf("%s/%s uid=%s grace=%s", ns, name, uid, g))
	return nil
}
func (c *fakeCluster) SetCondition(_ context.Context, typ string, required bool, _, _ string) error {
	if _, ok := c.conditions[typ]; !ok && !required {
		return nil
	}
	c.conditions[typ] = required
	return nil
}
func (c *fakeCluster) Event(_, reason, msg string) { c.events = append(c.events, reason+": "+msg) }
func (c *fakeCluster) Changes() <-chan struct{}    { return nil }

func (c *fakeCluster) reasons() []string {
	var out []string
	for _, e := range c.events {
		r, _, _ := strings.Cut(e, ":")
		out = append(out, r)
	}
	return out
}

// fakeResetter answers resets from its queue (nil: success).
type fakeResetter struct {
	calls   []string
	results []error
	timeout bool
}

func (f *fakeResetter) Reset(_ context.Context, g topology.GPU, _ time.Duration) (bool, error) {
	f.calls = append(f.calls, g.PCIBusID)
	var err error
	if len(f.results) > 0 {
		err, f.results = f.results[0], f.results[1:]
	}
	return err != nil && f.timeout, err
}

// hopperNode is 4 H100s on an NVSwitch fabric.
func hopperNode() *topology.Node {
	n := &topology.Node{}
	for i := range 4 {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x18+i),
			ComputeMajor: 9})
	}
	for a := range 4 {
		for b := a + 1; b < 4; b++ {
			n.Links = append(n.Links, topology.Link{A: a, B: b, NVLinks: 18})
		}
	}
	return n
}

// assignments has pod ns/name holding device ids through the device plugin.
func assignments(pods map[string][]string) *usage.Assignments {
	resp := &podresourcesv1.ListPodResourcesResponse{}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range pods {
			if !yield(k) {
				return
			}
		}
	}) {
		ns, name, _ := strings.Cut(k, "/")
		resp.PodResources = append(resp.PodResources, &podresourcesv1.PodResources{Namespace: ns, Name: name,
			Containers: []*podresourcesv1.ContainerResources{{Name: "c", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "nvidia.com/gpu", DeviceIds: pods[k]}}}}})
	}
	return usage.NewAssignments(resp, nil)
}

type rig struct {
	r       *Remediator
	h       *fakeHealth
	c       *fakeCluster
	reset   *fakeResetter
	a       *usage.Assignments
	procs   int
	root    string
	reg     *prometheus.Registry
	now     time.Time
	fmAlive bool
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc/sys/kernel/random"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(DefaultSentinelPath)), 0o755); err != nil {
		t.Fatal(err)
	}
	writeBoot(t, root, "boot-1")
	g := &rig{h: &fakeHealth{}, c: newFakeCluster(), reset: &fakeResetter{}, a: assignments(nil), root: root,
		reg: prometheus.NewRegistry(), now: time.Unix(1_700_000_000, 0)}
	node := hopperNode()
	r, err := New(cfg, Options{Health: g.h, Cluster: g.c, Resetter: g.reset,
		Node:          func() *topology.Node { return node },
		Assignments:   func() *usage.Assignments { return g.a },
		Processes:     func(string) (int, bool) { return g.procs, true },
		HostRoot:      root,
		FabricManager: func() bool { return g.fmAlive },
		Registerer:    g.reg})
	if err != nil {
		t.Fatal(err)
	}
	r.now = func() time.Time { return g.now }
	g.r = r
	return g
}

func writeBoot(t *testing.T, root, id string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, "proc/sys/kernel/random/boot_id"), []byte(id+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (g *rig) count(action, result string) int {
	return int(testutil.ToFloat64(g.r.total.WithLabelValues(action, result)))
}

func (g *rig) sentinel() (string, bool) {
	b, err := os.ReadFile(filepath.Join(g.root, DefaultSentinelPath))
	return string(b), err == nil
}

var resetFault = health.Remedy{Device: "GPU-1", GPU: "GPU-1", Action: health.ActionResetGPU, Reasons: []string{"xid 48: double-bit ECC error"}}

func on() Config {
	return Config{Reset: ResetConfig{Enabled: true}, Drain: DrainConfig{Enabled: true}, Reboot: RebootConfig{Enabled: true}}
}

func TestResetIdleGPU(t *testing.T) {
	g := newRig(t, on())
	g.h.set(resetFault)
	ctx := context.Background()
	g.r.Reconcile(ctx)
	if !slices.Equal(g.reset.calls, []string{"00000000:19:00.0"}) {
		t.Fatalf("resets %v, want GPU-1's bus ID once", g.reset.calls)
	}
	if got := g.c.reasons(); !slices.Equal(got, []string{"GPUResetStarted", "GPUResetSucceeded"}) {
		t.Errorf("events %v", got)
	}
	if len(g.h.observed) != 1 || !g.h.observed[0].Reset || g.h.observed[0].DeviceID != "GPU-1" {
		t.Errorf("observed %+v, want reset evidence for GPU-1", g.h.observed)
	}
	if g.count(ActionReset, ResultSuccess) != 1 || g.c.acquired != 1 {
		t.Errorf("reset/success %d, slots acquired %d; want 1, 1", g.count(ActionReset, ResultSuccess), g.c.acquired)
	}
	// The fault released: the slot is given back, nothing else happens.
	g.r.Reconcile(ctx)
	if len(g.reset.calls) != 1 || g.c.released != 1 || g.c.held {
		t.Errorf("after recovery: resets %d, released %d; want 1, 1", len(g.reset.calls), g.c.released)
	}
	if _, ok := g.sentinel(); ok {
		t.Error("a sentinel was written for a reset that worked")
	}
}

func TestResetWaitsForHoldersAndDrains(t *testing.T) {
	ctx := context.Background()
	t.Run("drain off: waits", func(t *testing.T) {
		cfg := on()
		cfg.Drain.Enabled = false
		g := newRig(t, cfg)
		g.h.set(resetFault)
		g.a = assignments(map[string][]string{"ml/train-0": {"GPU-1"}})
		g.r.Reconcile(ctx)
		g.r.Reconcile(ctx)
		if len(g.reset.calls) != 0 || len(g.c.evicted) != 0 {
			t.Fatalf("resets %v evictions %v with a pod holding the GPU and drain off", g.reset.calls, g.c.evicted)
		}
		if got := g.c.reasons(); !slices.Equal(got, []string{"GPUResetWaiting"}) || !strings.Contains(g.c.events[0], "ml/train-0") {
			t.Errorf("events %q, want one GPUResetWaiting naming the pod", g.c.events)
		}
	})
	t.Run("budget blocks, then evicts, then resets", func(t *testing.T) {
		cfg := on()
		grace := Duration(20 * time.Second)
		cfg.Drain.GracePeriod = &grace
		g := newRig(t, cfg)
		g.h.set(resetFault)
		g.a = assignments(map[string][]string{"ml/train-0": {"GPU-1"}, "ml/other": {"GPU-2"}})
		g.c.evictErr = fmt.Errorf("%w: Cannot evict pod as it would violate the pod's disruption budget", ErrDisruptionBudget)
		g.r.Reconcile(ctx)
		g.r.Reconcile(ctx)
		if g.count(ActionDrain, ResultBlocked) != 1 || len(g.reset.calls) != 0 {
			t.Fatalf("drain/blocked %d resets %d; want 1 (once for two passes), 0", g.count(ActionDrain, ResultBlocked), len(g.reset.calls))
		}
		g.c.evictErr = nil
		g.r.Reconcile(ctx)
		if !slices.Equal(g.c.evicted, []string{"ml/train-0 uid= grace=20s"}) || g.count(ActionDrain, ResultSuccess) != 1 {
			t.Fatalf("evicted %v drain/success %d; want only the pod on GPU-1", g.c.evicted, g.count(ActionDrain, ResultSuccess))
		}
		g.a = assignments(map[string][]string{"ml/other": {"GPU-2"}})
		g.r.Reconcile(ctx)
		if len(g.reset.calls) != 1 {
			t.Fatalf("resets %v after the pod went", g.reset.calls)
		}
	})
	t.Run("processes", func(t *testing.T) {
		g := newRig(t, on())
		g.h.set(resetFault)
		g.procs = 2
		g.r.Reconcile(ctx)
		if len(g.reset.calls) != 0 || !strings.Contains(strings.Join(g.c.events, "\n"), "2 processes still use it") {
			t.Fatalf("resets %v events %q with processes on the GPU", g.reset.calls, g.c.events)
		}
	})
	t.Run("assignments unknown", func(t *testing.T) {
		g := newRig(t, on())
		g.h.set(resetFault)
		g.a = nil
		g.r.Reconcile(ctx)
		if len(g.reset.calls) != 0 {
			t.Fatal("reset while the kubelet's assignments are unknown")
		}
	})
	t.Run("not evictable", func(t *testing.T) {
		g := newRig(t, on())
		g.h.set(resetFault)
		g.a = assignments(map[string][]string{"kube-system/ds-pod": {"GPU-1"}})
		g.c.evictErr = fmt.Errorf("%w: it is a DaemonSet's pod", ErrNotEvictable)
		g.r.Reconcile(ctx)
		if g.count(ActionDrain, ResultUnsafe) != 1 || len(g.reset.calls) != 0 {
			t.Fatalf("drain/unsafe %d resets %d", g.count(ActionDrain, ResultUnsafe), len(g.reset.calls))
		}
	})
}

func TestFailedResetRequestsReboot(t *testing.T) {
	for _, timeout := range []bool{false, true} {
		t.Run(fmt.Sprint("timeout=", timeout), func(t *testing.T) {
			g := newRig(t, on())
			g.h.set(resetFault)
			g.reset.results = []error{errors.New("nvidia-smi -r -i 00000000:19:00.0 exited with status 255")}
			g.reset.timeout = timeout
			g.r.Reconcile(context.Background())
			want := ResultFailed
			if timeout {
				want = ResultTimeout
			}
			if g.count(ActionReset, want) != 1 || g.count(ActionReboot, ResultSuccess) != 1 {
				t.Fatalf("reset/%s %d reboot/success %d; events %q", want, g.count(ActionReset, want), g.count(ActionReboot, ResultSuccess), g.c.events)
			}
			s, ok := g.sentinel()
			if !ok || !strings.HasPrefix(s, sentinelMarker) || !strings.Contains(s, "boot_id=boot-1") || !strings.Contains(s, "reset failed") {
				t.Fatalf("sentinel %q", s)
			}
			if !g.c.conditions[DefaultRebootCondition] {
				t.Error("reboot condition not True")
			}
			// Still needed: no second reset, no second request.
			g.r.Reconcile(context.Background())
			if len(g.reset.calls) != 1 || g.count(ActionReboot, ResultSuccess) != 1 {
				t.Errorf("resets %d reboot requests %d after a second pass", len(g.reset.calls), g.count(ActionReboot, ResultSuccess))
			}
		})
	}
}

func TestRebootRequestAndWithdrawal(t *testing.T) {
	g := newRig(t, on())
	ctx := context.Background()
	g.h.set(health.Remedy{Device: "GPU-2", GPU: "GPU-2", Action: health.ActionReboot, Reasons: []string{"xid 79: GPU has fallen off the bus"}})
	g.r.Reconcile(ctx)
	if _, ok := g.sentinel(); !ok || !g.c.conditions[DefaultRebootCondition] || len(g.reset.calls) != 0 {
		t.Fatalf("sentinel %v condition %v resets %v", ok, g.c.conditions, g.reset.calls)
	}
	// An operator cleared the fault: the request is withdrawn.
	g.h.set()
	g.r.Reconcile(ctx)
	if _, ok := g.sentinel(); ok || g.c.conditions[DefaultRebootCondition] || g.c.held {
		t.Fatalf("after the fault went: sentinel %v condition %v slot held %v", ok, g.c.conditions, g.c.held)
	}
}

func TestRestoreAfterReboot(t *testing.T) {
	// The sentinel went with the reboot (a tmpfs): the condition a
	// NodeHealthCheck selects is set False all the same.
	g := newRig(t, on())
	g.c.conditions[DefaultRebootCondition] = true
	g.r.restore()
	g.r.Reconcile(context.Background())
	if g.c.conditions[DefaultRebootCondition] {
		t.Fatal("the reboot condition stays True after a reboot that removed the sentinel")
	}
	g = newRig(t, on())
	path := filepath.Join(g.root, DefaultSentinelPath)
	write := func(boot string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(sentinelMarker+": x\nboot_id="+boot+"\nreason=r\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("boot-1")
	g.r.restore()
	if _, err := os.Stat(path); err != nil || g.r.reboot == nil || !g.r.reboot.written {
		t.Fatalf("a request of this boot was dropped: %v %+v", err, g.r.reboot)
	}
	write("boot-0")
	g.c.conditions[DefaultRebootCondition] = true
	g.r.restore()
	g.r.Reconcile(context.Background())
	if _, err := os.Stat(path); !os.IsNotExist(err) || g.c.conditions[DefaultRebootCondition] {
		t.Fatalf("a request of an earlier boot stays: %v, condition %v", err, g.c.conditions)
	}
	// Someone else's sentinel (a package upgrade) is never removed.
	if err := os.WriteFile(path, []byte("*** System restart required ***\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.r.restore()
	g.r.Reconcile(context.Background())
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("a foreign sentinel was removed: %v", err)
	}
}

func TestSafeguardRefusesSteps(t *testing.T) {
	g := newRig(t, on())
	g.c.refuse = true
	g.h.set(resetFault)
	g.r.Reconcile(context.Background())
	g.r.Reconcile(context.Background())
	// Asked again, the safeguard words the same refusal otherwise (it
	// read other slots): still one refusal.
	g.c.why = "no slot of 1 was free when this node last read them; it reads again shortly (fleet size 3)"
	g.r.Reconcile(context.Background())
	if len(g.reset.calls) != 0 || g.count(ActionReset, ResultRefused) != 1 {
		t.Fatalf("resets %v reset/refused %d", g.reset.calls, g.count(ActionReset, ResultRefused))
	}
	if got := g.c.reasons(); !slices.Equal(got, []string{"RemediationRefused"}) || !strings.Contains(g.c.events[0], "1 of 1 slots") {
		t.Errorf("events %q", g.c.events)
	}
	g.h.set(health.Remedy{Device: "GPU-2", GPU: "GPU-2", Action: health.ActionReboot})
	g.r.Reconcile(context.Background())
	if _, ok := g.sentinel(); ok || g.count(ActionReboot, ResultRefused) != 1 {
		t.Fatalf("reboot requested without a slot (sentinel %v, refused %d)", ok, g.count(ActionReboot, ResultRefused))
	}
	// No fault left: the refusal's hold (the watch a refused node keeps on
	// its bucket of slots) is given back too.
	g.h.set()
	g.r.Reconcile(context.Background())
	if g.c.released != 1 {
		t.Errorf("released %d times once no fault asks for a step after refusals, want 1", g.c.released)
	}
}

func TestPausedAndDryRun(t *testing.T) {
	t.Run("paused", func(t *testing.T) {
		g := newRig(t, on())
		g.c.paused = true
		g.h.set(resetFault)
		g.r.Reconcile(context.Background())
		g.r.Reconcile(context.Background())
		if len(g.reset.calls) != 0 || !slices.Equal(g.c.reasons(), []string{"RemediationPaused"}) {
			t.Fatalf("resets %v events %q", g.reset.calls, g.c.events)
		}
		if g.count(ActionReset, ResultPaused) != 1 || g.count(ActionReboot, ResultPaused) != 0 {
			t.Errorf("reset/paused %d reboot/paused %d, want 1, 0", g.count(ActionReset, ResultPaused), g.count(ActionReboot, ResultPaused))
		}
	})
	t.Run("dry run", func(t *testing.T) {
		cfg := on()
		cfg.Reset.DryRun, cfg.Drain.DryRun, cfg.Reboot.DryRun = true, true, true
		g := newRig(t, cfg)
		g.h.set(resetFault)
		g.a = assignments(map[string][]string{"ml/train-0": {"GPU-1"}})
		g.r.Reconcile(context.Background())
		g.a = assignments(nil)
		g.r.Reconcile(context.Background())
		g.h.set(health.Remedy{Device: "GPU-2", GPU: "GPU-2", Action: health.ActionReboot})
		g.r.Reconcile(context.Background())
		if len(g.reset.calls) != 0 || len(g.c.evicted) != 0 || g.c.acquired != 0 {
			t.Fatalf("a dry run acted: resets %v evictions %v slots %d", g.reset.calls, g.c.evicted, g.c.acquired)
		}
		if _, ok := g.sentinel(); ok {
			t.Fatal("a dry run wrote the sentinel")
		}
		for _, a := range []string{ActionDrain, ActionReset, ActionReboot} {
			if g.count(a, ResultDryRun) != 1 {
				t.Errorf("%s/dry-run %d, want 1", a, g.count(a, ResultDryRun))
			}
		}
		for _, e := range g.c.events {
			if !strings.Contains(e, "dry run: would") {
				t.Errorf("event %q does not say it is a dry run", e)
			}
		}
	})
}

func TestResetAgainWithinWindowAsksReboot(t *testing.T) {
	g := newRig(t, on())
	fault := resetFault
	fault.Seen = g.now
	g.h.set(fault)
	g.r.Reconcile(context.Background())
	// The checks have not looked again since the reset (the driver's
	// recovery action still reads as before): no second reset, no
	// reboot, nothing posted.
	g.now = g.now.Add(time.Second)
	g.h.set(fault)
	events := len(g.c.events)
	g.r.Reconcile(context.Background())
	if len(g.reset.calls) != 1 || g.count(ActionReboot, ResultSuccess) != 0 || len(g.c.events) != events {
		t.Fatalf("a fault not seen since the reset: resets %d reboots %d events %q", len(g.reset.calls), g.count(ActionReboot, ResultSuccess), g.c.events[events:])
	}
	g.now = g.now.Add(10 * time.Minute)
	fault.Seen = g.now // the fault came back
	g.h.set(fault)
	g.r.Reconcile(context.Background())
	if len(g.reset.calls) != 1 || g.count(ActionReboot, ResultSuccess) != 1 {
		t.Fatalf("resets %d reboot requests %d; want the second fault to ask for a reboot", len(g.reset.calls), g.count(ActionReboot, ResultSuccess))
	}
}

func TestResetUnsafe(t *testing.T) {
	hopper := hopperNode()
	ampere := hopperNode()
	volta := hopperNode()
	for i := range ampere.GPUs {
		ampere.GPUs[i].ComputeMajor = 8
		volta.GPUs[i].ComputeMajor = 7
	}
	pcieVolta := &topology.Node{GPUs: []topology.GPU{{Index: 0, UUID: "GPU-0", ComputeMajor: 7}, {Index: 1, UUID: "GPU-1", ComputeMajor: 7}}}
	mig := hopperNode()
	mig.GPUs[1].MIG = []topology.MIGDevice{{UUID: "MIG-a"}}
	vgpu := hopperNode()
	vgpu.Host.VGPU = &topology.VGPU{Present: true}
	unknown := hopperNode()
	unknown.GPUs[1].ComputeMajor = 0
	for _, tc := range []struct {
		name     string
		n        *topology.Node
		fm, mig  bool
		contains string
	}{
		{"hopper nvswitch", hopper, false, false, ""},
		{"ampere nvswitch with fabric manager", ampere, true, false, ""},
		{"ampere nvswitch without fabric manager", ampere, false, false, "needs Fabric Manager"},
		{"volta nvlink", volta, true, false, "NVLink peers (GPUs 0, 2, 3)"},
		{"volta pcie only", pcieVolta, false, false, ""},
		{"mig", mig, false, false, "1 MIG devices"},
		{"mig allowed", mig, false, true, ""},
		{"vgpu guest", vgpu, false, false, "vGPU guest"},
		{"unknown architecture", unknown, false, false, "architecture is unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resetUnsafe(tc.n.GPUs[1], tc.n, tc.mig, func() bool { return tc.fm })
			if tc.contains == "" && got != "" || tc.contains != "" && !strings.Contains(got, tc.contains) {
				t.Errorf("resetUnsafe = %q, want %q", got, tc.contains)
			}
		})
	}
}

func TestUnsafeResetAsksReboot(t *testing.T) {
	cfg := on()
	g := newRig(t, cfg)
	node := hopperNode()
	node.GPUs[1].MIG = []topology.MIGDevice{{UUID: "MIG-a"}}
	g.r.opts.Node = func() *topology.Node { return node }
	g.h.set(resetFault)
	g.r.Reconcile(context.Background())
	g.r.Reconcile(context.Background())
	if len(g.reset.calls) != 0 || g.count(ActionReset, ResultUnsafe) != 1 || g.count(ActionReboot, ResultSuccess) != 1 {
		t.Fatalf("resets %v reset/unsafe %d reboot %d", g.reset.calls, g.count(ActionReset, ResultUnsafe), g.count(ActionReboot, ResultSuccess))
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"defaults", Config{}, ""},
		{"drain without reset", Config{Drain: DrainConfig{Enabled: true}}, "remediation.drain.enabled needs remediation.reset.enabled"},
		{"relative sentinel", Config{Reboot: RebootConfig{SentinelPath: "var/run/reboot-required"}}, "remediation.reboot.sentinelPath"},
		{"bad condition", Config{Reboot: RebootConfig{ConditionType: "GPU Reboot"}}, "remediation.reboot.conditionType"},
		{"negative timeout", Config{Reset: ResetConfig{Timeout: Duration(-time.Second)}}, "remediation.reset.timeout"},
		{"empty command word", Config{Reset: ResetConfig{Command: []string{"chroot", ""}}}, "remediation.reset.command[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.WithDefaults().Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestResetWaitsForAssignmentsAfterTheFault: assignments listed before
// the fault was seen may miss a pod given the GPU in between, so no step
// is taken on them; the next ones, listed after it, decide (here: the
// pod holds the GPU, so it is drained, not reset).
func TestResetWaitsForAssignmentsAfterTheFault(t *testing.T) {
	ctx := context.Background()
	g := newRig(t, on())
	fault := resetFault
	fault.Seen = g.now
	g.h.set(fault)
	g.a = assignments(nil).WithListed(g.now.Add(-time.Second))
	g.r.Reconcile(ctx)
	if len(g.reset.calls) != 0 || len(g.c.evicted) != 0 || len(g.c.events) != 0 {
		t.Fatalf("on assignments listed before the fault: resets %v, evictions %v, events %v", g.reset.calls, g.c.evicted, g.c.events)
	}
	g.a = assignments(map[string][]string{"ml/train-0": {"GPU-1"}}).WithListed(g.now.Add(time.Second))
	g.r.Reconcile(ctx)
	if len(g.reset.calls) != 0 {
		t.Fatalf("GPU reset under the pod the fresh assignments name: %v", g.reset.calls)
	}
	if len(g.c.evicted) != 1 {
		t.Fatalf("evictions %v, want the pod holding the GPU", g.c.evicted)
	}
}

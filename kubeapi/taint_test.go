package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
)

const nodeName = "gpu-node-1"

var otherTaint = corev1.Taint{Key: "example.com/maintenance", Value: "true", Effect: corev1.TaintEffectNoSchedule}

func testNode(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "uid-" + "name", Labels: map[string]string{"gpu": "true"}},
		Spec: corev1.NodeSpec{Taints: taints}}
}

var unfit = health.Fitness{Fit: false, Reason: "xid", Message: "GPU-0: xid 79", Devices: []string{"GPU-0"}}
var fit = health.Fitness{Fit: true}

// writes are the mutating actions the fake clientset saw.
func writes(c *fake.Clientset) []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range c.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			out = append(out, a)
		}
	}
	return out
}

func getNode(t *testing.T, c *fake.Clientset) *corev1.Node {
	t.Helper()
	n, err := c.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", nodeName)
	if err != nil {
		t.Fatal(err)
	}
	return n.(*corev1.Node)
}

func condition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == "GPUHealthy" {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func events(t *testing.T, c *fake.Clientset) []string {
	t.Helper()
	l, err := c.Tracker().List(schema.GroupVersionResource{Version: "v1", Resource: "events"},
		schema.GroupVersionKind{Version: "v1", Kind: "Event"}, "default")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.(*corev1.EventList).Items {
		out = append(out, e.Type+"/"+e.Reason)
	}
	return out
}

func newTestTainter(t *testing.T, c *fake.Clientset, cfg TaintConfig) *Tainter {
	t.Helper()
	tr, err := NewTainter(fakeClients(t, c), startWatch(t, c, 0), cfg, discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestNewTainterDuplicateRegistration: a second tainter on the same
// registry is an error the caller can report, not a panic.
func TestNewTainterDuplicateRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := newFake(t, testNode(nodeName))
	w := startWatch(t, c, 0)
	if _, err := NewTainter(fakeClients(t, c), w, TaintConfig{}, discard(), reg); err != nil {
		t.Fatalf("first tainter: %v", err)
	}
	tr, err := NewTainter(fakeClients(t, c), w, TaintConfig{}, discard(), reg)
	if err == nil || tr != nil {
		t.Fatalf("second tainter on one registry = %v, %v; want nil and an error", tr, err)
	}
	if !strings.Contains(err.Error(), "tainter metrics") {
		t.Fatalf("error %q does not name the tainter metrics", err)
	}
	if _, err := NewTainter(fakeClients(t, c), w, TaintConfig{}, discard(), nil); err != nil {
		t.Fatalf("tainter without registry: %v", err)
	}
}

func TestTainterMetricsLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newFake(t, testNode(nodeName))
	tr, err := NewTainter(fakeClients(t, c), startWatch(t, c, 0), TaintConfig{}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Reconcile(context.Background(), unfit); err != nil {
		t.Fatal(err)
	}
	problems, err := promtestutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// TestTainterReportsMaxFraction: the safeguard's taint.maxFraction is a
// series (the fleet alert's threshold), the default when unset.
func TestTainterReportsMaxFraction(t *testing.T) {
	for _, tc := range []struct {
		cfg  TaintConfig
		want string
	}{
		{TaintConfig{}, "0.2"},
		{TaintConfig{MaxFraction: 0.05}, "0.05"},
	} {
		reg := prometheus.NewRegistry()
		c := newFake(t, testNode(nodeName))
		if _, err := NewTainter(fakeClients(t, c), startWatch(t, c, 0), tc.cfg, discard(), reg); err != nil {
			t.Fatal(err)
		}
		want := `
# HELP gpu_node_agent_taint_max_fraction The fleet safeguard's taint.maxFraction: at most this fraction of the nodes taint.nodeSelector selects may carry the taint (one node always may).
# TYPE gpu_node_agent_taint_max_fraction gauge
gpu_node_agent_taint_max_fraction ` + tc.want + "\n"
		if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "gpu_node_agent_taint_max_fraction"); err != nil {
			t.Errorf("maxFraction %v: %v", tc.cfg.MaxFraction, err)
		}
	}
}

// TestTainterLifecycle: a fault, steady state, recovery; at steady state
// the tainter makes no request at all (it reads the informer's cache).
func TestTainterLifecycle(t *testing.T) {
	c := newFake(t, testNode(nodeName, otherTaint))
	tr := newTestTainter(t, c, TaintConfig{})
	ctx := context.Background()

	// Unfit: taint added next to the other one, condition False, an event.
	if err := tr.Reconcile(ctx, unfit); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	want := []corev1.Taint{otherTaint, {Key: "gpu-node-agent.io/unhealthy", Value: "xid", Effect: corev1.TaintEffectNoSchedule}}
	if !sameTaints(n.Spec.Taints, want) {
		t.Fatalf("taints %+v, want %+v", n.Spec.Taints, want)
	}
	if cond := condition(n); cond == nil || cond.Status != corev1.ConditionFalse || cond.Message != "GPU-0: xid 79" || cond.Reason != "DevicesUnhealthy" {
		t.Fatalf("condition %+v", cond)
	}
	if ev := events(t, c); len(ev) != 1 || ev[0] != "Warning/GPUUnhealthy" {
		t.Fatalf("events %v", ev)
	}
	if got := len(writes(c)); got != 4 {
		t.Fatalf("%d writes for a fault, want 4 (slot lease, taint, condition, event)", got)
	}
	if got := countVerb(c, "get"); got != 0 {
		t.Fatalf("%d GETs, want 0: the Node comes from the informer", got)
	}

	// Steady state: no request of any kind however often it reconciles.
	before := len(requests(c))
	for range 50 {
		if err := tr.Reconcile(ctx, unfit); err != nil {
			t.Fatal(err)
		}
	}
	if got := requests(c)[before:]; len(got) != 0 {
		t.Fatalf("%d requests at steady state, want 0: %v", len(got), got)
	}
	if got := promtestutil.ToFloat64(tr.w.writes.WithLabelValues("taint")); got != 1 {
		t.Fatalf("taint write counter %v", got)
	}

	// Fit again: our taint removed, the other kept, condition True, event.
	if err := tr.Reconcile(ctx, fit); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c)
	if !sameTaints(n.Spec.Taints, []corev1.Taint{otherTaint}) {
		t.Fatalf("taints after recovery %+v", n.Spec.Taints)
	}
	if cond := condition(n); cond == nil || cond.Status != corev1.ConditionTrue {
		t.Fatalf("condition after recovery %+v", cond)
	}
	if ev := events(t, c); len(ev) != 2 {
		t.Fatalf("events %v", ev)
	}
	before = len(requests(c))
	for range 10 {
		_ = tr.Reconcile(ctx, fit)
	}
	if got := len(requests(c)) - before; got != 0 {
		t.Fatalf("%d requests at healthy steady state", got)
	}
}

func TestTainterFirstHealthyReport(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{})
	if err := tr.Reconcile(context.Background(), fit); err != nil {
		t.Fatal(err)
	}
	if cond := condition(getNode(t, c)); cond == nil || cond.Status != corev1.ConditionTrue {
		t.Fatalf("condition %+v", cond)
	}
	if ev := events(t, c); len(ev) != 0 {
		t.Fatalf("a healthy start posted events %v", ev)
	}
}

// TestTainterConflict: the taint patch is guarded by the cached
// resourceVersion. When another writer changed the Node, the tainter
// waits for the informer to deliver it and retries without a GET; when
// the informer delivers nothing in time, it reads the Node once.
func TestTainterConflict(t *testing.T) {
	foreign := corev1.Taint{Key: "example.com/drain", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	tests := []struct {
		name string
		// write makes the conflicting write for real (else the conflict
		// is only answered, and the Node does not change).
		write    bool
		wantGets int
	}{
		{"informer delivers the newer node", true, 0},
		{"informer silent: one GET per conflict", false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, testNode(nodeName, otherTaint))
			tr := newTestTainter(t, c, TaintConfig{})
			// The informer that delivers gets as long as it may need on a
			// loaded machine (it answers in milliseconds); the silent one
			// is waited out, so briefly.
			tr.reader.catchUp = 20 * time.Millisecond
			if tc.write {
				tr.reader.catchUp = 10 * time.Second
			}
			conflicts := 0
			c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "" || conflicts >= 2 {
					return false, nil, nil
				}
				conflicts++
				if tc.write {
					if conflicts == 2 {
						return false, nil, nil // the one write made it stale
					}
					n := getNode(t, c).DeepCopy()
					n.Spec.Taints = append(n.Spec.Taints, foreign)
					updateNode(t, c, n)
					return false, nil, nil // the patch carries the old version: Conflict
				}
				return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, nodeName, errors.New("resourceVersion changed"))
			})
			if err := tr.Reconcile(context.Background(), unfit); err != nil {
				t.Fatal(err)
			}
			if got := countVerb(c, "get"); got != tc.wantGets {
				t.Fatalf("%d GETs, want %d", got, tc.wantGets)
			}
			n := getNode(t, c)
			if !hasTaint(n.Spec.Taints, "gpu-node-agent.io/unhealthy") || !hasTaint(n.Spec.Taints, otherTaint.Key) {
				t.Fatalf("taints %+v", n.Spec.Taints)
			}
			if tc.write && !hasTaint(n.Spec.Taints, foreign.Key) {
				t.Fatalf("the taint written during the conflict was lost: %+v", n.Spec.Taints)
			}
			if got := promtestutil.ToFloat64(tr.w.writes.WithLabelValues("taint")); got != 1 {
				t.Fatalf("taint writes %v, want 1", got)
			}
		})
	}
}

func TestTainterPatchCarriesResourceVersion(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	var body string
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" {
			body = string(a.(k8stesting.PatchAction).GetPatch())
		}
		return false, nil, nil
	})
	tr := newTestTainter(t, c, TaintConfig{})
	rv := getNode(t, c).ResourceVersion
	if err := tr.Reconcile(context.Background(), unfit); err != nil {
		t.Fatal(err)
	}
	if want := `"resourceVersion":"` + rv + `"`; !strings.Contains(body, want) {
		t.Fatalf("taint patch %s lacks %s", body, want)
	}
}

func TestTainterModes(t *testing.T) {
	for _, mode := range []string{TaintOff, TaintDryRun} {
		t.Run(mode, func(t *testing.T) {
			c := newFake(t, testNode(nodeName))
			tr := newTestTainter(t, c, TaintConfig{Mode: mode})
			for _, f := range []health.Fitness{unfit, unfit, fit} {
				if err := tr.Reconcile(context.Background(), f); err != nil {
					t.Fatal(err)
				}
			}
			if w := writes(c); len(w) != 0 {
				t.Fatalf("%s mode wrote %v", mode, w)
			}
			if r := requests(c); mode == TaintOff && len(r) != 0 {
				t.Fatalf("off mode touched the API: %v", r)
			}
		})
	}
}

func TestTainterNoExecuteForNodeFaults(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{NoExecuteForNodeFaults: true})
	nodeWide := health.Fitness{Reason: "nvml", Message: "node: nvml device count: ERROR_UNKNOWN", NodeWide: true}
	if err := tr.Reconcile(context.Background(), nodeWide); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	effects := map[corev1.TaintEffect]bool{}
	for _, x := range n.Spec.Taints {
		effects[x.Effect] = true
		if x.Effect == corev1.TaintEffectNoExecute && x.TimeAdded == nil {
			t.Fatal("NoExecute taint without timeAdded")
		}
	}
	if !effects[corev1.TaintEffectNoSchedule] || !effects[corev1.TaintEffectNoExecute] {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	if cond := condition(n); cond.Reason != "NVMLFailure" {
		t.Fatalf("condition %+v", cond)
	}
	// A device-only fault keeps NoSchedule only.
	if err := tr.Reconcile(context.Background(), unfit); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c); len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
}

// TestTainterFleetSafeguard: the tainter's own safeguard is Slots. A node
// may taint while a slot under K = max(1, floor(maxFraction × selected
// nodes)) is free; slots other agents hold (live leases) count, taints
// without a slot do not.
func TestTainterFleetSafeguard(t *testing.T) {
	tests := []struct {
		name        string
		nodes       int // including this one
		held        int // slots other nodes hold
		selected    int // nodes the selector picks (0: all)
		maxFraction float64
		wantTainted bool
	}{
		{"10 nodes, 1 slot held: K=2, one free", 10, 1, 0, 0.2, true},
		{"10 nodes, 2 slots held: K=2, none free", 10, 2, 0, 0.2, false},
		{"single node may always taint itself", 1, 0, 0, 0.2, true},
		{"5 nodes, 1 slot held: K=1", 5, 1, 0, 0.2, false},
		{"fraction 1 disables", 4, 3, 0, 1, true},
		{"selector shrinks the fleet: 5 of 10 selected, K=1", 10, 1, 5, 0.2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			self := testNode(nodeName)
			self.Labels = map[string]string{"fleet": "a"}
			objs = append(objs, self)
			for i := 1; i < tc.nodes; i++ {
				n := testNode(fmt.Sprintf("other-%d", i))
				if tc.selected == 0 || i < tc.selected {
					n.Labels = map[string]string{"fleet": "a"}
				}
				objs = append(objs, n)
			}
			now := metav1.NewMicroTime(time.Now())
			for i := range tc.held {
				objs = append(objs, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: safeguard.DefaultSlotPrefix + "-" + strconv.Itoa(i), Namespace: "default",
						Labels: map[string]string{safeguard.SlotLabel: safeguard.DefaultSlotPrefix,
							safeguard.BucketLabel: strconv.Itoa(i / safeguard.BucketSize)}},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: new(fmt.Sprintf("other-%d", i+1)),
						LeaseDurationSeconds: new(int32(900)), AcquireTime: &now, RenewTime: &now},
				})
			}
			c := newFake(t, objs...)
			tr := newTestTainter(t, c, TaintConfig{MaxFraction: tc.maxFraction, NodeSelector: "fleet=a"})
			if err := tr.Reconcile(context.Background(), unfit); err != nil {
				t.Fatal(err)
			}
			n := getNode(t, c)
			if got := len(tr.ourTaints(n.Spec.Taints)) > 0; got != tc.wantTainted {
				t.Fatalf("tainted = %v, want %v", got, tc.wantTainted)
			}
			if got := promtestutil.ToFloat64(tr.refusedGauge); got != boolGauge(!tc.wantTainted) {
				t.Fatalf("taint_refused = %v", got)
			}
			// The condition is informational and set either way.
			if cond := condition(n); cond == nil || cond.Status != corev1.ConditionFalse {
				t.Fatalf("condition %+v", cond)
			}
			if !tc.wantTainted {
				ev := events(t, c)
				if !slices.Contains(ev, "Warning/TaintRefused") {
					t.Fatalf("events %v", ev)
				}
				// Refusing again is not news: no more writes.
				before := len(writes(c))
				_ = tr.Reconcile(context.Background(), unfit)
				if got := len(writes(c)) - before; got != 0 {
					t.Fatalf("%d writes while still refused", got)
				}
				return
			}
			if tc.maxFraction < 1 {
				// Tainted means holding a slot; recovering gives it back.
				if !holdsSlot(t, c, nodeName) {
					t.Fatal("tainted without holding a slot")
				}
				if err := tr.Reconcile(context.Background(), health.Fitness{Fit: true}); err != nil {
					t.Fatal(err)
				}
				if holdsSlot(t, c, nodeName) {
					t.Fatal("fit and untainted but still holding a slot")
				}
			}
		})
	}
}

// holdsSlot says whether node holds a slot Lease in c.
func holdsSlot(t *testing.T, c *fake.Clientset, node string) bool {
	t.Helper()
	l, err := c.Tracker().List(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"},
		schema.GroupVersionKind{Group: "coordination.k8s.io", Version: "v1", Kind: "Lease"}, "default")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range l.(*coordinationv1.LeaseList).Items {
		if x.Spec.HolderIdentity != nil && *x.Spec.HolderIdentity == node {
			return true
		}
	}
	return false
}

// recordingSafeguard is a Safeguard that answers allow and records calls.
type recordingSafeguard struct {
	mu       sync.Mutex
	allow    bool
	calls    []string
	allowErr error
}

func (s *recordingSafeguard) Allow(context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "allow")
	return s.allow, s.allowErr
}

func (s *recordingSafeguard) Release(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, "release")
	return nil
}

// TestTainterSafeguardSeam: Allow is asked only before adding the taint,
// once per reconcile; Release once at a fit start and after the taint
// is removed; an Allow error fails the reconcile without a taint.
func TestTainterSafeguardSeam(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{})
	sg := &recordingSafeguard{allow: true}
	tr.SetSafeguard(sg)
	ctx := context.Background()
	for _, f := range []health.Fitness{fit, fit, unfit, unfit, fit, fit} {
		if err := tr.Reconcile(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"release", "allow", "release"}; !slices.Equal(sg.calls, want) {
		t.Fatalf("safeguard calls %v, want %v", sg.calls, want)
	}
	sg.allowErr = errors.New("slots unavailable")
	if err := tr.Reconcile(ctx, unfit); err == nil || !strings.Contains(err.Error(), "slots unavailable") {
		t.Fatalf("reconcile with a failing safeguard: %v", err)
	}
	if hasTaint(getNode(t, c).Spec.Taints, "gpu-node-agent.io/unhealthy") {
		t.Fatal("tainted although the safeguard failed")
	}
}

// TestTainterReleasesAfterRefusal: a refused node that turns fit calls
// Release once (it stops the watch a refused Slots follows a bucket
// with), and not again while it stays fit.
func TestTainterReleasesAfterRefusal(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{})
	sg := &recordingSafeguard{allow: false}
	tr.SetSafeguard(sg)
	for _, f := range []health.Fitness{fit, unfit, unfit, fit, fit} {
		if err := tr.Reconcile(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"release", "allow", "allow", "release"}; !slices.Equal(sg.calls, want) {
		t.Fatalf("safeguard calls %v, want %v", sg.calls, want)
	}
}

// TestTainterRunTakesFreedSlot: a node refused because the only slot
// (K = 1) is another node's is tainted as soon as that slot's Lease is
// deleted: the safeguard's Room signal reconciles it, with no health
// change, Node change or resync (the node watch has none).
func TestTainterRunTakesFreedSlot(t *testing.T) {
	now := metav1.NewMicroTime(time.Now())
	other := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: safeguard.DefaultSlotPrefix + "-0", Namespace: "default",
			Labels: map[string]string{safeguard.SlotLabel: safeguard.DefaultSlotPrefix, safeguard.BucketLabel: "0"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("other-1"), LeaseDurationSeconds: new(int32(900)),
			AcquireTime: &now, RenewTime: &now},
	}
	objs := []runtime.Object{testNode(nodeName), other}
	for i := 1; i < 5; i++ {
		objs = append(objs, testNode(fmt.Sprintf("other-%d", i)))
	}
	c := newFake(t, objs...)
	cfg := TaintConfig{MaxFraction: 0.2}
	tr := newTestTainter(t, c, cfg)
	slots := &countingSlots{Slots: safeguard.New(c, fakeClients(t, c).Meta, nodeName, cfg.WithDefaults().SafeguardConfig(), discard(),
		safeguard.WithoutSpread())}
	tr.SetSafeguard(slots)
	h := newFakeHealth(unfit)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- tr.Run(ctx, h) }()
	key := "gpu-node-agent.io/unhealthy"
	// Refused at start, and again on the Node update its condition write
	// makes; then nothing changes that would reconcile it.
	testutil.WaitFor(t, "refused twice while the only slot is held", func() bool {
		return promtestutil.ToFloat64(tr.refusedGauge) == 1 && slots.allows.Load() >= 2
	})
	if hasTaint(getNode(t, c).Spec.Taints, key) {
		t.Fatal("tainted while the only slot is another node's")
	}
	if err := c.CoordinationV1().Leases("default").Delete(t.Context(), other.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "tainted once the slot was freed", func() bool { return hasTaint(getNode(t, c).Spec.Taints, key) })
	if !holdsSlot(t, c, nodeName) {
		t.Fatal("tainted without holding the freed slot")
	}
	if got := promtestutil.ToFloat64(tr.refusedGauge); got != 0 {
		t.Fatalf("taint_refused = %v after taking the slot", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// countingSlots is the slot safeguard counting the tainter's Allows.
type countingSlots struct {
	*safeguard.Slots
	allows atomic.Int32
}

func (s *countingSlots) Allow(ctx context.Context) (bool, error) {
	s.allows.Add(1)
	return s.Slots.Allow(ctx)
}

// TestTainterRunFollowsNode runs the tainter: a fault taints the node;
// someone removing the taint is repaired from the informer's update alone
// (no health change, no resync); recovery removes it.
func TestTainterRunFollowsNode(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{})
	h := newFakeHealth(fit)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx, h) }()
	key := "gpu-node-agent.io/unhealthy"
	h.set(unfit)
	// The condition is written after the taint: wait for both, so the
	// tainter writes nothing more while the test changes the Node (a
	// write in between would make the test's update conflict and GET
	// again).
	testutil.WaitFor(t, "taint and condition after the fault", func() bool {
		n := getNode(t, c)
		cond := condition(n)
		return hasTaint(n.Spec.Taints, key) && cond != nil && cond.Status == corev1.ConditionFalse
	})
	gets := countVerb(c, "get")
	modifyNode(t, c, func(n *corev1.Node) { n.Spec.Taints = nil })
	testutil.WaitFor(t, "taint repaired after its removal", func() bool { return hasTaint(getNode(t, c).Spec.Taints, key) })
	h.set(fit)
	testutil.WaitFor(t, "taint removed after recovery", func() bool { return !hasTaint(getNode(t, c).Spec.Taints, key) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := countVerb(c, "get") - gets; got != 1 {
		t.Fatalf("%d GETs, want only the test's own", got)
	}
}

// TestTainterRunRetriesWhileAPIDown: writes fail while the API server is
// unavailable; Run retries with its backoff until they land.
func TestTainterRunRetriesWhileAPIDown(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	var mu sync.Mutex
	down := 3
	c.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if down > 0 {
			down--
			return true, nil, apierrors.NewServiceUnavailable("apiserver down")
		}
		return false, nil, nil
	})
	tr := newTestTainter(t, c, TaintConfig{})
	tr.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 2, Jitter: 1, Steps: 10}
	h := newFakeHealth(unfit)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx, h) }()
	testutil.WaitFor(t, "taint after the API server came back", func() bool {
		return hasTaint(getNode(t, c).Spec.Taints, "gpu-node-agent.io/unhealthy")
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if down != 0 {
		t.Fatalf("%d failures left", down)
	}
}

// TestRetryBackoffJittered: the first retry delays of agents failing
// together are spread over [1s, 2s), not one value, and they grow.
func TestRetryBackoffJittered(t *testing.T) {
	first := map[time.Duration]bool{}
	for range 50 {
		b := RetryBackoff()
		d := b.Step()
		if d < time.Second || d >= 2*time.Second {
			t.Fatalf("first delay %s outside [1s, 2s)", d)
		}
		first[d] = true
	}
	if len(first) < 10 {
		t.Fatalf("50 first delays took only %d values: not jittered", len(first))
	}
	b := RetryBackoff()
	var last time.Duration
	for range 20 {
		last = b.Step()
	}
	if last < time.Minute || last >= 2*time.Minute {
		t.Fatalf("delay after 20 failures %s, want within [1m, 2m)", last)
	}
}

// fakeClearer records ClearFaults calls.
type fakeClearer struct {
	mu    sync.Mutex
	calls []string
	err   error
}

func (c *fakeClearer) ClearFaults(target string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, target)
	if c.err != nil {
		return nil, c.err
	}
	return []string{target}, nil
}

func (c *fakeClearer) called() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func annotated(value string) *corev1.Node {
	n := testNode(nodeName)
	n.Annotations = map[string]string{ClearFaultsAnnotation: value, "other": "kept"}
	return n
}

func TestTainterClearFaultsAnnotation(t *testing.T) {
	tests := []struct {
		name       string
		node       *corev1.Node
		clearErr   error
		wantCalls  []string
		wantEvent  string // "" for none
		wantRemove bool
	}{
		{name: "no annotation does nothing", node: testNode(nodeName)},
		{name: "gpu uuid", node: annotated("GPU-0"), wantCalls: []string{"GPU-0"}, wantEvent: "Normal/FaultsCleared", wantRemove: true},
		{name: "all", node: annotated("all"), wantCalls: []string{"all"}, wantEvent: "Normal/FaultsCleared", wantRemove: true},
		{name: "unknown uuid rejected, annotation still removed", node: annotated("GPU-9"), clearErr: errors.New(`clear faults: unknown device "GPU-9"`),
			wantCalls: []string{"GPU-9"}, wantEvent: "Warning/ClearFaultsRejected", wantRemove: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, tc.node)
			tr := newTestTainter(t, c, TaintConfig{})
			cl := &fakeClearer{err: tc.clearErr}
			tr.SetFaultClearer(cl)
			// Twice: the request is acted on once.
			for range 2 {
				if err := tr.Reconcile(context.Background(), fit); err != nil {
					t.Fatal(err)
				}
			}
			if got := cl.called(); !slices.Equal(got, tc.wantCalls) {
				t.Fatalf("ClearFaults calls %q, want %q", got, tc.wantCalls)
			}
			n := getNode(t, c)
			if _, ok := n.Annotations[ClearFaultsAnnotation]; tc.wantRemove && ok {
				t.Fatalf("annotation still there: %v", n.Annotations)
			}
			if tc.node.Annotations["other"] != "" && n.Annotations["other"] != "kept" {
				t.Fatalf("other annotation lost: %v", n.Annotations)
			}
			var ev []string
			for _, e := range events(t, c) {
				if e != "Normal/GPUHealthy" {
					ev = append(ev, e)
				}
			}
			if tc.wantEvent == "" {
				if len(ev) != 0 {
					t.Fatalf("events %v", ev)
				}
				return
			}
			if len(ev) != 1 || ev[0] != tc.wantEvent {
				t.Fatalf("events %v, want [%s]", ev, tc.wantEvent)
			}
		})
	}
}

// TestTainterClearFaultsFromInformer: an operator's annotation set while
// the tainter runs is acted on from the informer's update alone.
func TestTainterClearFaultsFromInformer(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{})
	cl := &fakeClearer{}
	tr.SetFaultClearer(cl)
	h := newFakeHealth(fit)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx, h) }()
	testutil.WaitFor(t, "the first reconcile", func() bool { return condition(getNode(t, c)) != nil })
	modifyNode(t, c, func(n *corev1.Node) { n.Annotations = map[string]string{ClearFaultsAnnotation: "GPU-3"} })
	testutil.WaitFor(t, "the clear-faults request acted on and removed", func() bool {
		_, ok := getNode(t, c).Annotations[ClearFaultsAnnotation]
		return !ok && slices.Equal(cl.called(), []string{"GPU-3"})
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestTainterClearFaultsRace: the annotation changed between the read and
// the removal; the guarded patch fails and the new request is kept, then
// acted on by the next reconcile.
func TestTainterClearFaultsRace(t *testing.T) {
	c := newFake(t, annotated("GPU-0"))
	raced := false
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetPatchType() != types.JSONPatchType || raced {
			return false, nil, nil
		}
		raced = true
		n := getNode(t, c).DeepCopy()
		n.Annotations[ClearFaultsAnnotation] = "all"
		updateNode(t, c, n)
		return false, nil, nil
	})
	tr := newTestTainter(t, c, TaintConfig{})
	cl := &fakeClearer{}
	tr.SetFaultClearer(cl)
	if err := tr.Reconcile(context.Background(), fit); err == nil {
		t.Fatal("removal succeeded although the annotation had changed")
	}
	if got := getNode(t, c).Annotations[ClearFaultsAnnotation]; got != "all" {
		t.Fatalf("annotation %q, want the newer request kept", got)
	}
	if err := tr.Reconcile(context.Background(), fit); err != nil {
		t.Fatal(err)
	}
	if got := cl.called(); !slices.Equal(got, []string{"GPU-0", "all"}) {
		t.Fatalf("calls %q", got)
	}
	if _, ok := getNode(t, c).Annotations[ClearFaultsAnnotation]; ok {
		t.Fatal("annotation not removed after acting on the newer request")
	}
}

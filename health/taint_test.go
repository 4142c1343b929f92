package health

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

const nodeName = "gpu-node-1"

var otherTaint = corev1.Taint{Key: "example.com/maintenance", Value: "true", Effect: corev1.TaintEffectNoSchedule}

func testNode(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "uid-" + "name", Labels: map[string]string{"gpu": "true"}},
		Spec: corev1.NodeSpec{Taints: taints}}
}

var unfit = Fitness{Fit: false, Reason: "xid", Message: "GPU-0: xid 79", Devices: []string{"GPU-0"}}
var fit = Fitness{Fit: true}

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
	n, err := c.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
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
	l, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range l.Items {
		out = append(out, e.Type+"/"+e.Reason)
	}
	return out
}

func newTestTainter(t *testing.T, c *fake.Clientset, cfg TaintConfig) *Tainter {
	t.Helper()
	tr, err := NewTainter(c, nodeName, cfg, discard(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// TestNewTainterDuplicateRegistration: a second tainter on the same
// registry is an error the caller can report, not a panic.
func TestNewTainterDuplicateRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewTainter(fake.NewClientset(), nodeName, TaintConfig{}, discard(), reg); err != nil {
		t.Fatalf("first tainter: %v", err)
	}
	tr, err := NewTainter(fake.NewClientset(), nodeName, TaintConfig{}, discard(), reg)
	if err == nil || tr != nil {
		t.Fatalf("second tainter on one registry = %v, %v; want nil and an error", tr, err)
	}
	if !strings.Contains(err.Error(), "tainter metrics") {
		t.Fatalf("error %q does not name the tainter metrics", err)
	}
	if _, err := NewTainter(fake.NewClientset(), nodeName, TaintConfig{}, discard(), nil); err != nil {
		t.Fatalf("tainter without registry: %v", err)
	}
}

func TestTainterLifecycle(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName, otherTaint))
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
	if got := len(writes(c)); got != 3 {
		t.Fatalf("%d writes for a fault, want 3 (taint, condition, event)", got)
	}

	// Steady state: no writes however often it reconciles.
	before := len(writes(c))
	for range 50 {
		if err := tr.Reconcile(ctx, unfit); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(writes(c)) - before; got != 0 {
		t.Fatalf("%d writes at steady state, want 0: %v", got, writes(c)[before:])
	}
	if got := testutil.ToFloat64(tr.writes.WithLabelValues("taint")); got != 1 {
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
	before = len(writes(c))
	for range 10 {
		_ = tr.Reconcile(ctx, fit)
	}
	if got := len(writes(c)) - before; got != 0 {
		t.Fatalf("%d writes at healthy steady state", got)
	}
}

func TestTainterFirstHealthyReport(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName))
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

func TestTainterConflictRetried(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName, otherTaint))
	conflicts := 0
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" && conflicts < 2 {
			conflicts++
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, nodeName, errors.New("resourceVersion changed"))
		}
		return false, nil, nil
	})
	tr := newTestTainter(t, c, TaintConfig{})
	if err := tr.Reconcile(context.Background(), unfit); err != nil {
		t.Fatal(err)
	}
	if conflicts != 2 {
		t.Fatalf("conflicts = %d", conflicts)
	}
	gets := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" {
			gets++
		}
	}
	if gets != 3 {
		t.Fatalf("%d gets, want 3 (a fresh read per attempt)", gets)
	}
	if n := getNode(t, c); len(n.Spec.Taints) != 2 {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
}

func TestTainterPatchCarriesResourceVersion(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName))
	n := getNode(t, c)
	n.ResourceVersion = "42"
	if _, err := c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.ClearActions()
	var body string
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" {
			body = string(a.(k8stesting.PatchAction).GetPatch())
		}
		return false, nil, nil
	})
	if err := newTestTainter(t, c, TaintConfig{}).Reconcile(context.Background(), unfit); err != nil {
		t.Fatal(err)
	}
	if want := `"resourceVersion":"42"`; !strings.Contains(body, want) {
		t.Fatalf("taint patch %s lacks %s", body, want)
	}
}

func TestTainterModes(t *testing.T) {
	for _, mode := range []string{TaintOff, TaintDryRun} {
		t.Run(mode, func(t *testing.T) {
			c := fake.NewClientset(testNode(nodeName))
			tr := newTestTainter(t, c, TaintConfig{Mode: mode})
			for _, f := range []Fitness{unfit, unfit, fit} {
				if err := tr.Reconcile(context.Background(), f); err != nil {
					t.Fatal(err)
				}
			}
			if w := writes(c); len(w) != 0 {
				t.Fatalf("%s mode wrote %v", mode, w)
			}
			if mode == TaintOff && len(c.Actions()) != 0 {
				t.Fatalf("off mode touched the API: %v", c.Actions())
			}
		})
	}
}

func TestTainterNoExecuteForNodeFaults(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName))
	tr := newTestTainter(t, c, TaintConfig{NoExecuteForNodeFaults: true})
	nodeWide := Fitness{Reason: "nvml", Message: "node: nvml device count: ERROR_UNKNOWN", NodeWide: true}
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

func TestTainterFleetSafeguard(t *testing.T) {
	ours := corev1.Taint{Key: "gpu-node-agent.io/unhealthy", Value: "xid", Effect: corev1.TaintEffectNoSchedule}
	tests := []struct {
		name        string
		nodes       int // including this one
		tainted     int // other nodes already tainted
		maxFraction float64
		selector    string
		wantTainted bool
	}{
		{"10 nodes, 1 tainted: 2/10 is at the limit", 10, 1, 0.2, "", true},
		{"10 nodes, 2 tainted: 3/10 is over", 10, 2, 0.2, "", false},
		{"single node may always taint itself", 1, 0, 0.2, "", true},
		{"5 nodes, 1 tainted: 2/5 over", 5, 1, 0.2, "", false},
		{"fraction 1 disables", 4, 3, 1, "", true},
		{"selector excludes the tainted nodes", 10, 2, 0.2, "gpu=true", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			objs = append(objs, testNode(nodeName))
			for i := 1; i < tc.nodes; i++ {
				n := testNode(fmt.Sprintf("other-%d", i))
				if i <= tc.tainted {
					n.Spec.Taints = []corev1.Taint{ours}
					if tc.selector != "" {
						n.Labels = nil
					}
				}
				objs = append(objs, n)
			}
			c := fake.NewClientset(objs...)
			tr := newTestTainter(t, c, TaintConfig{MaxFraction: tc.maxFraction, NodeSelector: tc.selector})
			if err := tr.Reconcile(context.Background(), unfit); err != nil {
				t.Fatal(err)
			}
			n := getNode(t, c)
			if got := len(tr.ourTaints(n.Spec.Taints)) > 0; got != tc.wantTainted {
				t.Fatalf("tainted = %v, want %v", got, tc.wantTainted)
			}
			if got := testutil.ToFloat64(tr.refusedGauge); got != boolGauge(!tc.wantTainted) {
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
			}
		})
	}
}

// TestTainterRunRetriesWhileAPIDown runs the tainter against a monitor and
// an API server that fails the first reads.
func TestTainterRunRetriesWhileAPIDown(t *testing.T) {
	c := fake.NewClientset(testNode(nodeName))
	var mu sync.Mutex
	down := 3
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if down > 0 {
			down--
			return true, nil, apierrors.NewServiceUnavailable("apiserver down")
		}
		return false, nil, nil
	})
	m, err := NewMonitor(Config{}, ownerOf(newFakeNVML(1)), discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(t0)
	m.clock = clk
	m.SetNode(newFakeNVML(1).node(false))
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Fatal: true, Event: true, Reason: "xid 79"})
	tr := newTestTainter(t, c, TaintConfig{})
	tr.minBackoff = time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx, m) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := getNodeNoFail(c)
		if n != nil && len(tr.ourTaints(n.Spec.Taints)) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("taint never added after the API server came back")
		}
		time.Sleep(time.Millisecond)
	}
	// Recovery reaches the node through the monitor's change signal.
	clk.Step(5 * time.Minute)
	m.evaluate()
	for {
		if n := getNodeNoFail(c); n != nil && len(tr.ourTaints(n.Spec.Taints)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("taint not removed after recovery")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func getNodeNoFail(c *fake.Clientset) *corev1.Node {
	n, err := c.Tracker().Get(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, "", nodeName)
	if err != nil {
		return nil
	}
	return n.(*corev1.Node)
}

// fakeClearer records ClearFaults calls.
type fakeClearer struct {
	calls []string
	err   error
}

func (c *fakeClearer) ClearFaults(target string) ([]string, error) {
	c.calls = append(c.calls, target)
	if c.err != nil {
		return nil, c.err
	}
	return []string{target}, nil
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
			c := fake.NewClientset(tc.node)
			tr := newTestTainter(t, c, TaintConfig{})
			cl := &fakeClearer{err: tc.clearErr}
			tr.SetFaultClearer(cl)
			// Twice: the request is acted on once.
			for range 2 {
				if err := tr.Reconcile(context.Background(), fit); err != nil {
					t.Fatal(err)
				}
			}
			if !slices.Equal(cl.calls, tc.wantCalls) {
				t.Fatalf("ClearFaults calls %q, want %q", cl.calls, tc.wantCalls)
			}
			n := getNode(t, c)
			if _, ok := n.Annotations[ClearFaultsAnnotation]; tc.wantRemove && ok {
				t.Fatalf("annotation still there: %v", n.Annotations)
			}
			if tc.node.Annotations["other"] != "" && n.Annotations["other"] != "kept" {
				t.Fatalf("other annotation lost: %v", n.Annotations)
			}
			ev := events(t, c)
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

// TestTainterClearFaultsRace: the annotation changed between the read and
// the removal; the guarded patch fails and the new request is kept, then
// acted on by the next reconcile.
func TestTainterClearFaultsRace(t *testing.T) {
	c := fake.NewClientset(annotated("GPU-0"))
	raced := false
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.PatchAction).GetPatchType() != types.JSONPatchType || raced {
			return false, nil, nil
		}
		raced = true
		n := getNodeNoFail(c).DeepCopy()
		n.Annotations[ClearFaultsAnnotation] = "all"
		if err := c.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}, n, ""); err != nil {
			t.Fatal(err)
		}
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
	if !slices.Equal(cl.calls, []string{"GPU-0", "all"}) {
		t.Fatalf("calls %q", cl.calls)
	}
	if _, ok := getNode(t, c).Annotations[ClearFaultsAnnotation]; ok {
		t.Fatal("annotation not removed after acting on the newer request")
	}
}

// TestTainterClearFaultsMonitor runs the annotation against a real
// monitor: a held XID is released and recovers a period later.
func TestTainterClearFaultsMonitor(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m, _ := newStateMonitor(t, t.TempDir(), "", clk)
	m.SetNode(testNodeModel())
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 79", Fatal: true, Event: true, Reason: "xid 79", XID: 79})
	c := fake.NewClientset(annotated("GPU-0"))
	tr := newTestTainter(t, c, TaintConfig{})
	tr.SetFaultClearer(m)
	if err := tr.Reconcile(context.Background(), m.Fitness()); err != nil {
		t.Fatal(err)
	}
	clk.Step(5 * time.Minute)
	m.evaluate()
	if !m.Healthy("GPU-0") {
		t.Fatalf("GPU-0 not recovered after the operator clear: %+v", m.Status("GPU-0"))
	}
	if err := tr.Reconcile(context.Background(), m.Fitness()); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c); len(tr.ourTaints(n.Spec.Taints)) != 0 {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
}

package kubeapi

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const healthKey = "gpu-node-agent.io/unhealthy"

var healthTaint = corev1.Taint{Key: healthKey, Value: "xid", Effect: corev1.TaintEffectNoSchedule}

func newTestGate(t *testing.T, c *fake.Clientset, cfg PreflightGateConfig) *preflightGate {
	t.Helper()
	g := newPreflightGate(c, startWatch(t, c, 0), cfg, newWritesCounter(), discard())
	// However slow the machine, the informer delivers each write before
	// the next read (it returns as soon as it does): the tests count
	// requests, and a lagging informer would add a GET.
	g.reader.catchUp = time.Minute
	return g
}

// preflightCond is the node's GPUPreflight condition, nil without one.
func preflightCond(n *corev1.Node) *corev1.NodeCondition {
	return findCondition(n, DefaultPreflightCondition)
}

// gateTaints are the node's taints with the preflight key, as
// key=value:effect.
func gateTaints(n *corev1.Node) []string {
	return taintStrings(taintsWithKey(n.Spec.Taints, DefaultPreflightTaintKey))
}

// provenNode is a node whose preflight passed in an earlier run.
func provenNode(taints ...corev1.Taint) *corev1.Node {
	n := testNode(nodeName, taints...)
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: DefaultPreflightCondition, Status: corev1.ConditionTrue,
		Reason: "PreflightPassed", Message: "preflight passed (9 items passed, 3 skipped)", LastHeartbeatTime: now, LastTransitionTime: now}}
	return n
}

// TestPreflightGateTransitions: a node registered without the taint goes
// pending (no verdict yet), still pending while the preflight runs, failed,
// failed with other items, pending again (a re-run), then passed: the taint
// follows with value pending or failed and is removed on the pass, the
// condition follows, an Event marks each change to failed or passed only,
// the health taint and other taints are never touched, and each state
// reached makes no more requests however often it is reconciled.
func TestPreflightGateTransitions(t *testing.T) {
	c := newFake(t, testNode(nodeName, otherTaint, healthTaint))
	g := newTestGate(t, c, PreflightGateConfig{})
	ctx := context.Background()
	const pcie = "preflight failed: pcie-link: GPU 3 (0000:33:00.0): PCIe link gen 4 x8, max gen 5 x16: width below its maximum"
	const ecc = "preflight failed: ecc-mode: GPU 1 (0000:11:00.0): ECC disabled"
	steps := []struct {
		name    string
		verdict *PreflightVerdict
		// taint is the preflight taint wanted ("" for none).
		taint                       string
		status                      corev1.ConditionStatus
		reason, message             string
		events                      []string // all Events so far
		taintWrites, conditionWrite int      // made by this step
	}{
		{name: "no verdict yet", taint: DefaultPreflightTaintKey + "=pending:NoSchedule",
			status: corev1.ConditionFalse, reason: "PreflightPending", message: "preflight has not run yet",
			taintWrites: 1, conditionWrite: 1},
		{name: "running", verdict: &PreflightVerdict{Message: "preflight running"},
			taint:  DefaultPreflightTaintKey + "=pending:NoSchedule",
			status: corev1.ConditionFalse, reason: "PreflightPending", message: "preflight running",
			conditionWrite: 1},
		{name: "failed", verdict: &PreflightVerdict{Ran: true, Message: pcie},
			taint:  DefaultPreflightTaintKey + "=failed:NoSchedule",
			status: corev1.ConditionFalse, reason: "PreflightFailed", message: pcie,
			events: []string{"Warning/PreflightFailed"}, taintWrites: 1, conditionWrite: 1},
		{name: "failed again, other items: no new event", verdict: &PreflightVerdict{Ran: true, Message: ecc},
			taint:  DefaultPreflightTaintKey + "=failed:NoSchedule",
			status: corev1.ConditionFalse, reason: "PreflightFailed", message: ecc,
			events: []string{"Warning/PreflightFailed"}, conditionWrite: 1},
		{name: "re-run pending: no event", verdict: &PreflightVerdict{},
			taint:  DefaultPreflightTaintKey + "=pending:NoSchedule",
			status: corev1.ConditionFalse, reason: "PreflightPending", message: "preflight has not finished yet",
			events: []string{"Warning/PreflightFailed"}, taintWrites: 1, conditionWrite: 1},
		{name: "passed", verdict: &PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (9 items passed, 3 skipped)"},
			status: corev1.ConditionTrue, reason: "PreflightPassed", message: "preflight passed (9 items passed, 3 skipped)",
			events: []string{"Warning/PreflightFailed", "Normal/PreflightPassed"}, taintWrites: 1, conditionWrite: 1},
	}
	var taintWrites, conditionWrites float64
	for _, s := range steps {
		before := len(requests(c))
		if err := g.reconcile(ctx, s.verdict); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		n := getNode(t, c)
		var want []string
		if s.taint != "" {
			want = []string{s.taint}
		}
		if got := gateTaints(n); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%s: preflight taints %v, want %v", s.name, got, want)
		}
		if !hasTaint(n.Spec.Taints, otherTaint.Key) || !hasTaint(n.Spec.Taints, healthKey) || len(n.Spec.Taints) != 2+len(want) {
			t.Fatalf("%s: other taints not kept as they were: %+v", s.name, n.Spec.Taints)
		}
		cond := preflightCond(n)
		if cond == nil || cond.Status != s.status || cond.Reason != s.reason || cond.Message != s.message {
			t.Fatalf("%s: condition %+v, want %s %s %q", s.name, cond, s.status, s.reason, s.message)
		}
		if got := events(t, c); strings.Join(got, ",") != strings.Join(s.events, ",") {
			t.Fatalf("%s: events %v, want %v", s.name, got, s.events)
		}
		taintWrites += float64(s.taintWrites)
		conditionWrites += float64(s.conditionWrite)
		if got := promtestutil.ToFloat64(g.w.writes.WithLabelValues("taint")); got != taintWrites {
			t.Fatalf("%s: %v taint writes in all, want %v", s.name, got, taintWrites)
		}
		if got := promtestutil.ToFloat64(g.w.writes.WithLabelValues("condition")); got != conditionWrites {
			t.Fatalf("%s: %v condition writes in all, want %v", s.name, got, conditionWrites)
		}
		if got := countVerb(c, "get"); got != 0 {
			t.Fatalf("%s: %d GETs, want 0: the Node comes from the informer", s.name, got)
		}
		// Steady state: no request of any kind.
		mid := len(requests(c))
		if mid == before {
			t.Fatalf("%s: no request for a change", s.name)
		}
		for range 20 {
			if err := g.reconcile(ctx, s.verdict); err != nil {
				t.Fatal(err)
			}
		}
		if got := requests(c)[mid:]; len(got) != 0 {
			t.Fatalf("%s: %d requests at steady state, want 0: %v", s.name, len(got), got)
		}
	}
}

// TestPreflightGateRegisteredTaint: a node the kubelet registered with
// the taint (--register-with-taints) already carries it: before a verdict
// only the condition is written.
func TestPreflightGateRegisteredTaint(t *testing.T) {
	registered := corev1.Taint{Key: DefaultPreflightTaintKey, Value: "pending", Effect: corev1.TaintEffectNoSchedule}
	c := newFake(t, testNode(nodeName, registered))
	g := newTestGate(t, c, PreflightGateConfig{})
	if err := g.reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := promtestutil.ToFloat64(g.w.writes.WithLabelValues("taint")); got != 0 {
		t.Fatalf("%v taint writes, want none: the registered taint is the one wanted", got)
	}
	if cond := preflightCond(getNode(t, c)); cond == nil || cond.Reason != "PreflightPending" {
		t.Fatalf("condition %+v", cond)
	}
}

// TestPreflightGateProvenNode: a node proven by an earlier run is left
// untainted and unwritten (no request at all) until a verdict arrives; a
// pass then only refreshes the condition's message (no Event: neither its
// status nor its reason change); a verdict that is not a pass taints it.
func TestPreflightGateProvenNode(t *testing.T) {
	c := newFake(t, provenNode(otherTaint))
	g := newTestGate(t, c, PreflightGateConfig{})
	ctx := context.Background()
	for range 5 {
		if err := g.reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r := requests(c); len(r) != 0 {
		t.Fatalf("%d requests for a proven node without a verdict, want 0: %v", len(r), r)
	}
	if got := gateTaints(getNode(t, c)); len(got) != 0 {
		t.Fatalf("proven node tainted %v", got)
	}

	passed := &PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (10 items passed, 2 skipped)"}
	if err := g.reconcile(ctx, passed); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	if cond := preflightCond(n); cond.Status != corev1.ConditionTrue || cond.Message != passed.Message {
		t.Fatalf("condition %+v", cond)
	}
	if ev := events(t, c); len(ev) != 0 {
		t.Fatalf("events %v for a pass on a proven node", ev)
	}
	if w := writes(c); len(w) != 1 || w[0].GetSubresource() != "status" {
		t.Fatalf("writes %v, want the condition's only", w)
	}

	failed := &PreflightVerdict{Ran: true, Message: "preflight failed: gpu-count: node: 7 GPUs in NVML, 8 on the PCI bus"}
	if err := g.reconcile(ctx, failed); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c)
	if got := gateTaints(n); len(got) != 1 || got[0] != DefaultPreflightTaintKey+"=failed:NoSchedule" {
		t.Fatalf("taints %v after a failed verdict", got)
	}
	if ev := events(t, c); len(ev) != 1 || ev[0] != "Warning/PreflightFailed" {
		t.Fatalf("events %v", ev)
	}
}

// TestPreflightGateRebootedNode: a pass recorded before the host booted
// proves nothing of the node now: without a verdict the node is tainted
// pending again, saying why; the next pass untaints it with a condition
// dated after the boot, which a restarted agent (same boot) then leaves
// alone. A pass arriving before any pending write also re-dates the
// condition, though it reads the same.
func TestPreflightGateRebootedNode(t *testing.T) {
	boot := time.Now().Add(-time.Minute).Truncate(time.Second)
	stale := func() *corev1.Node {
		n := provenNode(otherTaint)
		n.Status.Conditions[0].LastTransitionTime = metav1.NewTime(boot.Add(-time.Hour))
		return n
	}
	passed := &PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (9 items passed, 3 skipped)"}
	ctx := context.Background()

	c := newFake(t, stale())
	g := newTestGate(t, c, PreflightGateConfig{BootTime: boot})
	if err := g.reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	if got := gateTaints(n); len(got) != 1 || got[0] != DefaultPreflightTaintKey+"=pending:NoSchedule" {
		t.Fatalf("taints %v on a node rebooted since its pass, want pending", got)
	}
	if cond := preflightCond(n); cond.Status != corev1.ConditionFalse || cond.Reason != reasonPreflightPending ||
		!strings.Contains(cond.Message, "rebooted") {
		t.Fatalf("condition %+v, want False/PreflightPending saying the node rebooted", cond)
	}
	if err := g.reconcile(ctx, passed); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c)
	if got := gateTaints(n); len(got) != 0 {
		t.Fatalf("taints %v after the pass", got)
	}
	if cond := preflightCond(n); cond.Status != corev1.ConditionTrue || cond.LastTransitionTime.Time.Before(boot) {
		t.Fatalf("condition %+v after the pass, want True since the boot at %v", cond, boot)
	}
	if ev := events(t, c); len(ev) != 1 || ev[0] != "Normal/PreflightPassed" {
		t.Fatalf("events %v", ev)
	}
	mark := len(requests(c))
	restarted := newTestGate(t, c, PreflightGateConfig{BootTime: boot})
	if err := restarted.reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if r := requests(c)[mark:]; len(r) != 0 {
		t.Fatalf("%d requests from a restarted agent on a node passed since boot, want 0: %v", len(r), r)
	}

	// Without a boot time (preflight.keepAcrossReboots) the old pass holds.
	c = newFake(t, stale())
	if err := newTestGate(t, c, PreflightGateConfig{}).reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if r := requests(c); len(r) != 0 {
		t.Fatalf("%d requests without a boot time, want 0: %v", len(r), r)
	}

	// The verdict first: the same status, reason and message, re-dated.
	c = newFake(t, stale())
	if err := newTestGate(t, c, PreflightGateConfig{BootTime: boot}).reconcile(ctx, passed); err != nil {
		t.Fatal(err)
	}
	if cond := preflightCond(getNode(t, c)); cond.Status != corev1.ConditionTrue || cond.LastTransitionTime.Time.Before(boot) {
		t.Fatalf("condition %+v after a pass over a pre-boot one, want True since the boot", cond)
	}
}

// TestPreflightGateRerun: an operator's re-run annotation on a proven
// node taints it pending with the condition naming the request, is
// removed, posts an Event and has the agent run again (once); the held
// pass no longer decides, the node stays pending at no further request
// until a new verdict, which then decides. In dry-run mode the request is
// left alone.
func TestPreflightGateRerun(t *testing.T) {
	n := provenNode(otherTaint)
	n.Annotations = map[string]string{PreflightRerunAnnotation: "gpu 3 reseated", "example.com/keep": "x"}
	c := newFake(t, n)
	g := newTestGate(t, c, PreflightGateConfig{})
	reruns := 0
	g.rerun = func() { reruns++ }
	passed := &PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (12 items passed)"}
	ctx := context.Background()
	if err := g.reconcile(ctx, passed); err != nil {
		t.Fatal(err)
	}
	n = getNode(t, c)
	if got := gateTaints(n); len(got) != 1 || got[0] != DefaultPreflightTaintKey+"=pending:NoSchedule" {
		t.Fatalf("taints %v after a re-run request, want pending", got)
	}
	if cond := preflightCond(n); cond.Status != corev1.ConditionFalse || cond.Reason != reasonPreflightPending ||
		!strings.Contains(cond.Message, PreflightRerunAnnotation+"=gpu 3 reseated") {
		t.Fatalf("condition %+v, want False/PreflightPending naming the request", cond)
	}
	if _, ok := n.Annotations[PreflightRerunAnnotation]; ok || n.Annotations["example.com/keep"] != "x" {
		t.Fatalf("annotations %v: want the request removed, the rest kept", n.Annotations)
	}
	if ev := events(t, c); len(ev) != 1 || ev[0] != "Normal/PreflightRerun" {
		t.Fatalf("events %v", ev)
	}
	if reruns != 1 {
		t.Fatalf("%d re-runs asked, want 1", reruns)
	}
	// No verdict (the NodeObject dropped the held one): the node stays
	// pending, however often it is reconciled.
	mark := len(requests(c))
	for range 3 {
		if err := g.reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	if r := requests(c)[mark:]; len(r) != 0 {
		t.Fatalf("%d requests while the re-run runs, want 0: %v", len(r), r)
	}
	failed := &PreflightVerdict{Ran: true, Message: "preflight failed: pcie-link: GPU 3 (0000:33:00.0): PCIe link gen 4 x8, max gen 5 x16"}
	if err := g.reconcile(ctx, failed); err != nil {
		t.Fatal(err)
	}
	if got := gateTaints(getNode(t, c)); len(got) != 1 || got[0] != DefaultPreflightTaintKey+"=failed:NoSchedule" {
		t.Fatalf("taints %v after the re-run failed", got)
	}
	if err := g.reconcile(ctx, passed); err != nil {
		t.Fatal(err)
	}
	if n := getNode(t, c); len(gateTaints(n)) != 0 || preflightCond(n).Status != corev1.ConditionTrue {
		t.Fatalf("taints %v, condition %+v after the re-run passed", gateTaints(n), preflightCond(n))
	}
	if reruns != 1 {
		t.Fatalf("%d re-runs asked, want 1", reruns)
	}

	dry := provenNode()
	dry.Annotations = map[string]string{PreflightRerunAnnotation: ""}
	c = newFake(t, dry)
	g = newTestGate(t, c, PreflightGateConfig{DryRun: true})
	g.rerun = func() { reruns++ }
	if err := g.reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := getNode(t, c).Annotations[PreflightRerunAnnotation]; !ok || reruns != 1 || len(requests(c)) != 0 {
		t.Fatalf("dry run: annotation kept %v, re-runs %d, requests %v", ok, reruns, requests(c))
	}
}

// TestPreflightGateProvenButTainted: a node proven but carrying the
// preflight taint (someone put it there, or a run crashed between its two
// writes) is left as it is until a verdict arrives, which then decides.
func TestPreflightGateProvenButTainted(t *testing.T) {
	tainted := corev1.Taint{Key: DefaultPreflightTaintKey, Value: "failed", Effect: corev1.TaintEffectNoSchedule}
	c := newFake(t, provenNode(tainted))
	g := newTestGate(t, c, PreflightGateConfig{})
	if err := g.reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if r := requests(c); len(r) != 0 {
		t.Fatalf("%d requests without a verdict, want 0: %v", len(r), r)
	}
	if err := g.reconcile(context.Background(), &PreflightVerdict{Ran: true, Passed: true}); err != nil {
		t.Fatal(err)
	}
	if got := gateTaints(getNode(t, c)); len(got) != 0 {
		t.Fatalf("taints %v after a pass", got)
	}
}

// TestPreflightGateDryRun: in dry-run mode nothing is written, whatever
// the verdicts; the Node is only read from the informer.
func TestPreflightGateDryRun(t *testing.T) {
	c := newFake(t, testNode(nodeName, otherTaint))
	g := newTestGate(t, c, PreflightGateConfig{DryRun: true})
	for _, v := range []*PreflightVerdict{nil, {}, {Ran: true, Message: "preflight failed: x"}, {Ran: true, Passed: true}, nil} {
		if err := g.reconcile(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
	if r := requests(c); len(r) != 0 {
		t.Fatalf("dry run made requests %v", r)
	}
	if n := getNode(t, c); len(n.Spec.Taints) != 1 || len(n.Status.Conditions) != 0 {
		t.Fatalf("dry run changed the node: %+v %+v", n.Spec.Taints, n.Status.Conditions)
	}
}

// TestPreflightGateConfigured: the taint key, condition type and event
// namespace are the configured ones.
func TestPreflightGateConfigured(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	g := newTestGate(t, c, PreflightGateConfig{TaintKey: "example.com/gpu-proven", ConditionType: "GPUProven", EventNamespace: "gpu-ops"})
	if err := g.reconcile(context.Background(), &PreflightVerdict{Ran: true, Message: "preflight failed: x"}); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].ToString() != "example.com/gpu-proven=failed:NoSchedule" {
		t.Fatalf("taints %+v", n.Spec.Taints)
	}
	if cond := findCondition(n, "GPUProven"); cond == nil || cond.Reason != "PreflightFailed" || preflightCond(n) != nil {
		t.Fatalf("conditions %+v", n.Status.Conditions)
	}
	l, err := c.CoreV1().Events("gpu-ops").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].Reason != "PreflightFailed" || l.Items[0].InvolvedObject.Name != nodeName ||
		l.Items[0].ReportingController != "gpu-node-agent.io/preflight" {
		t.Fatalf("events %+v", l.Items)
	}
}

// TestPreflightGateLongMessage: a summary over the API server's limit is
// cut to MaxMessage on the condition and the Event.
func TestPreflightGateLongMessage(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	g := newTestGate(t, c, PreflightGateConfig{})
	long := "preflight failed: " + strings.Repeat("nvlink: GPU 0 (0000:03:00.0): link 17 down; ", 40)
	if err := g.reconcile(context.Background(), &PreflightVerdict{Ran: true, Message: long}); err != nil {
		t.Fatal(err)
	}
	cond := preflightCond(getNode(t, c))
	if len(cond.Message) != MaxMessage || !strings.HasSuffix(cond.Message, "...") || !strings.HasPrefix(long, strings.TrimSuffix(cond.Message, "...")) {
		t.Fatalf("condition message of %d bytes: %q", len(cond.Message), cond.Message)
	}
	// The same long verdict again is the same truncated message: no write.
	before := len(requests(c))
	if err := g.reconcile(context.Background(), &PreflightVerdict{Ran: true, Message: long}); err != nil {
		t.Fatal(err)
	}
	if got := requests(c)[before:]; len(got) != 0 {
		t.Fatalf("requests %v for an unchanged long message", got)
	}
}

// TestPreflightGateConflict: another writer changes the taints between
// the gate's read and its patch; the guarded patch fails with Conflict,
// and the retry keeps the other writer's taint.
func TestPreflightGateConflict(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	foreign := corev1.Taint{Key: "example.com/drain", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	var once sync.Once
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "" {
			once.Do(func() {
				n := getNode(t, c).DeepCopy()
				n.Spec.Taints = append(n.Spec.Taints, foreign)
				updateNode(t, c, n)
			})
		}
		return false, nil, nil
	})
	g := newTestGate(t, c, PreflightGateConfig{})
	if err := g.reconcile(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, c)
	if !hasTaint(n.Spec.Taints, foreign.Key) || !hasTaint(n.Spec.Taints, DefaultPreflightTaintKey) {
		t.Fatalf("taints %+v, want both the other writer's and the preflight's", n.Spec.Taints)
	}
	if got := promtestutil.ToFloat64(g.w.writes.WithLabelValues("taint")); got != 1 {
		t.Fatalf("%v taint writes, want 1", got)
	}
}

// TestPreflightGateRunRepairsTaint runs the gate: a failed verdict taints
// the node; someone removing the taint is repaired from the informer's
// update alone; a pass removes it for good (removing it again is not
// repaired).
func TestPreflightGateRunRepairsTaint(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	g := newTestGate(t, c, PreflightGateConfig{})
	var verdict struct {
		sync.Mutex
		v *PreflightVerdict
	}
	changed := make(chan struct{}, 1)
	set := func(v *PreflightVerdict) {
		verdict.Lock()
		verdict.v = v
		verdict.Unlock()
		changed <- struct{}{}
	}
	get := func() *PreflightVerdict {
		verdict.Lock()
		defer verdict.Unlock()
		return verdict.v
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.run(ctx, changed, get); close(done) }()
	defer func() { cancel(); <-done }()

	value := func() string {
		for _, x := range getNode(t, c).Spec.Taints {
			if x.Key == DefaultPreflightTaintKey {
				return x.Value
			}
		}
		return ""
	}
	testutil.WaitFor(t, "the pending taint at start", func() bool { return value() == "pending" })
	modifyNode(t, c, func(n *corev1.Node) { n.Spec.Taints = nil })
	testutil.WaitFor(t, "the pending taint put back", func() bool { return value() == "pending" })
	set(&PreflightVerdict{Ran: true, Message: "preflight failed: throttle: GPU 2 (0000:22:00.0): hw-slowdown active"})
	testutil.WaitFor(t, "the failed taint", func() bool { return value() == "failed" })
	modifyNode(t, c, func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{otherTaint} })
	testutil.WaitFor(t, "the failed taint put back", func() bool { return value() == "failed" && hasTaint(getNode(t, c).Spec.Taints, otherTaint.Key) })
	set(&PreflightVerdict{Ran: true, Passed: true})
	// The taint goes first, then the condition, then the Event.
	testutil.WaitFor(t, "the taint removed and the pass posted", func() bool {
		return value() == "" && len(events(t, c)) == 2
	})
	if cond := preflightCond(getNode(t, c)); cond.Status != corev1.ConditionTrue {
		t.Fatalf("condition %+v", cond)
	}
	if ev := events(t, c); ev[0] != "Warning/PreflightFailed" || ev[1] != "Normal/PreflightPassed" {
		t.Fatalf("events %v", ev)
	}
}

// TestPreflightGateValidate: the gate's key and condition must be valid
// and not the health taint's.
func TestPreflightGateValidate(t *testing.T) {
	tests := []struct {
		name  string
		cfg   PreflightGateConfig
		taint TaintConfig
		want  []string // parts of the error; none for valid
	}{
		{name: "defaults"},
		{name: "own key and condition", cfg: PreflightGateConfig{TaintKey: "example.com/proven", ConditionType: "Proven"},
			taint: TaintConfig{Key: "example.com/unfit", ConditionType: "Fit"}},
		{name: "the health taint's key", cfg: PreflightGateConfig{TaintKey: healthKey},
			want: []string{`preflight.taintKey "gpu-node-agent.io/unhealthy": the health taint's key`}},
		{name: "the health key configured", taint: TaintConfig{Key: DefaultPreflightTaintKey},
			want: []string{`preflight.taintKey "gpu-node-agent.io/preflight": the health taint's key`}},
		{name: "the health condition", cfg: PreflightGateConfig{ConditionType: "GPUHealthy"},
			want: []string{`preflight.conditionType "GPUHealthy": the health condition's type`}},
		{name: "bad key and condition", cfg: PreflightGateConfig{TaintKey: "a/b/c", ConditionType: "GPU Preflight", EventNamespace: "Ops"},
			want: []string{`preflight.taintKey "a/b/c"`, `preflight.conditionType "GPU Preflight"`, `preflight event namespace "Ops"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate(tc.taint)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("valid, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// runNodeObject runs o until the test ends.
func runNodeObject(t *testing.T, o *NodeObject) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := o.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return ctx
}

// TestNodeObjectPreflight: the gate runs beside the tainter on one
// informer, also with tainting off; the health taint and the preflight
// taint come and go independently; both count their writes in one
// gpu_node_agent_kube_api_writes_total, which passes promlint.
func TestNodeObjectPreflight(t *testing.T) {
	for _, mode := range []string{TaintOn, TaintOff} {
		t.Run("taint "+mode, func(t *testing.T) {
			c := newFake(t, testNode(nodeName, otherTaint))
			h := newFakeHealth(fit)
			reg := prometheus.NewPedanticRegistry()
			o := NewNodeObject(NodeObjectConfig{
				NodeName: nodeName, Taint: TaintConfig{Mode: mode, MaxFraction: 1}, MIGStrategy: "none", Retry: time.Millisecond,
				NewClients: func() (Clients, error) { return fakeClients(t, c), nil },
				Preflight:  &PreflightGateConfig{},
			}, h, reg, discard())
			runNodeObject(t, o)
			has := func(key string) bool { return hasTaint(getNode(t, c).Spec.Taints, key) }
			testutil.WaitFor(t, "the pending preflight taint", func() bool { return has(DefaultPreflightTaintKey) })
			if mode == TaintOn {
				h.set(unfit)
				testutil.WaitFor(t, "the health taint", func() bool { return has(healthKey) })
				h.set(fit)
				testutil.WaitFor(t, "the health taint removed", func() bool { return !has(healthKey) })
				if !has(DefaultPreflightTaintKey) {
					t.Fatal("the tainter removed the preflight taint")
				}
				h.set(unfit)
				testutil.WaitFor(t, "the health taint again", func() bool { return has(healthKey) })
			}
			o.SetPreflight(PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (9 items passed, 3 skipped)"})
			testutil.WaitFor(t, "the preflight taint removed and the condition True", func() bool {
				cond := preflightCond(getNode(t, c))
				return !has(DefaultPreflightTaintKey) && cond != nil && cond.Status == corev1.ConditionTrue
			})
			if !has(otherTaint.Key) || has(healthKey) != (mode == TaintOn) {
				t.Fatalf("taints %+v", getNode(t, c).Spec.Taints)
			}
			if got := promtestutil.ToFloat64(o.writes.WithLabelValues("taint")); (mode == TaintOn && got != 5) || (mode == TaintOff && got != 2) {
				t.Fatalf("%v taint writes counted, want both writers' (preflight 2, health 3)", got)
			}
			problems, err := promtestutil.GatherAndLint(reg, "gpu_node_agent_kube_api_writes_total")
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("%s: %s", p.Metric, p.Text)
			}
		})
	}
}

// TestNodeObjectPreflightRerun: the re-run annotation put on a running
// node object's proven Node reaches the agent through PreflightRerun, with
// the held pass dropped and the node pending; the next pass untaints it.
func TestNodeObjectPreflightRerun(t *testing.T) {
	c := newFake(t, provenNode())
	o := NewNodeObject(NodeObjectConfig{
		NodeName: nodeName, Taint: TaintConfig{Mode: TaintOff}, Retry: time.Millisecond,
		NewClients: func() (Clients, error) { return fakeClients(t, c), nil },
		Preflight:  &PreflightGateConfig{},
	}, newFakeHealth(fit), nil, discard())
	ctx := runNodeObject(t, o)
	passed := PreflightVerdict{Ran: true, Passed: true, Message: "preflight passed (12 items passed)"}
	o.SetPreflight(passed)
	if _, _, err := o.PreflightRecord(ctx); err != nil {
		t.Fatal(err)
	}
	modifyNode(t, c, func(n *corev1.Node) { n.Annotations = map[string]string{PreflightRerunAnnotation: "after repair"} })
	select {
	case <-o.PreflightRerun():
	case <-time.After(30 * time.Second):
		t.Fatal("no re-run signalled")
	}
	if v := o.verdict.Load(); v != nil {
		t.Fatalf("verdict %+v held after the request, want none", v)
	}
	n := getNode(t, c)
	if !hasTaint(n.Spec.Taints, DefaultPreflightTaintKey) || preflightCond(n).Status != corev1.ConditionFalse {
		t.Fatalf("taints %v, condition %+v after the request, want pending", n.Spec.Taints, preflightCond(n))
	}
	if _, ok := n.Annotations[PreflightRerunAnnotation]; ok {
		t.Fatal("the request annotation was not removed")
	}
	o.SetPreflight(passed)
	testutil.WaitFor(t, "the preflight taint removed after the re-run passed", func() bool {
		n := getNode(t, c)
		return !hasTaint(n.Spec.Taints, DefaultPreflightTaintKey) && preflightCond(n).Status == corev1.ConditionTrue
	})
}

// TestNodeObjectPreflightRecord: PreflightRecord answers once the
// informer has synced: proven or not, and the Node's labels; it waits no
// longer than its context, and fails at once when no informer runs.
func TestNodeObjectPreflightRecord(t *testing.T) {
	rebooted := provenNode()
	boot := time.Now().Add(-time.Minute).Truncate(time.Second)
	rebooted.Status.Conditions[0].LastTransitionTime = metav1.NewTime(boot.Add(-time.Hour))
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		boot   time.Time
		proven bool
	}{
		{name: "new node", node: testNode(nodeName)},
		{name: "proven node", node: provenNode(), boot: boot, proven: true},
		{name: "proven before the boot", node: rebooted, boot: boot},
		{name: "proven before the boot, kept across reboots", node: rebooted.DeepCopy(), proven: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.node.Labels = map[string]string{"example.com/gpu-count": "8"}
			c := newFake(t, tc.node)
			ready := make(chan struct{})
			o := NewNodeObject(NodeObjectConfig{
				NodeName: nodeName, Taint: TaintConfig{Mode: TaintOff}, Retry: time.Millisecond, Preflight: &PreflightGateConfig{BootTime: tc.boot},
				NewClients: func() (Clients, error) {
					select {
					case <-ready:
						return fakeClients(t, c), nil
					default:
						return Clients{}, errors.New("no API access yet")
					}
				},
			}, newFakeHealth(fit), nil, discard())
			// Before the client exists it waits: a context that ends
			// says so.
			early, cancel := context.WithCancel(context.Background())
			cancel()
			if _, _, err := o.PreflightRecord(early); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "node informer not started") {
				t.Fatalf("PreflightRecord with an ended context: %v", err)
			}
			ctx := runNodeObject(t, o)
			close(ready)
			proven, labels, err := o.PreflightRecord(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if proven != tc.proven || labels["example.com/gpu-count"] != "8" {
				t.Fatalf("PreflightRecord = %v, %v; want %v and the node's labels", proven, labels, tc.proven)
			}
			labels["example.com/gpu-count"] = "changed"
			if _, again, _ := o.PreflightRecord(ctx); again["example.com/gpu-count"] != "8" {
				t.Fatal("PreflightRecord's labels are the informer's cache, not a copy")
			}
		})
	}
	t.Run("no informer", func(t *testing.T) {
		c := newFake(t, testNode(nodeName))
		o := NewNodeObject(NodeObjectConfig{
			NodeName: nodeName, Taint: TaintConfig{Mode: TaintOff}, Retry: time.Millisecond,
			NewClients: func() (Clients, error) { return fakeClients(t, c), nil },
		}, newFakeHealth(fit), nil, discard())
		ctx := runNodeObject(t, o)
		if _, _, err := o.PreflightRecord(ctx); err == nil || !strings.Contains(err.Error(), "no node informer runs") {
			t.Fatalf("PreflightRecord without an informer: %v", err)
		}
	})
}

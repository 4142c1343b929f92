package kubeapi

import (
	"context"
	"errors"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
)

const (
	remNS       = "ml"
	remPod      = "train-0"
	remPodUID   = "pod-uid-1"
	remOwnPod   = "agent-pod-uid"
	remCondType = "GPURebootRequired"
)

// remSlotConfig is the safeguard of the remediation tests: K = 1 for a
// fleet of up to three nodes.
func remSlotConfig() safeguard.Config {
	return safeguard.Config{Namespace: slotNS, TaintKey: slotTaint, MaxFraction: 0.5}.WithDefaults()
}

// The safeguard's namespace and taint key in these tests.
const (
	slotNS    = "gpu-node-agent"
	slotTaint = "gpu-node-agent.io/unhealthy"
)

// newTestRemediation starts a RemediationAPI for nodeName on c, as
// NodeObject.Run does, with the real Slots (no waits) behind its shared
// slot.
func newTestRemediation(t *testing.T, c *fake.Clientset) (*RemediationAPI, *safeguard.Shared) {
	t.Helper()
	cl := fakeClients(t, c)
	slot := safeguard.NewShared(safeguard.New(cl.Core, cl.Meta, nodeName, remSlotConfig(), discard(), safeguard.WithoutSpread()))
	a := &RemediationAPI{ownPod: remOwnPod, events: newNodeEvents(nodeName, "default", false, discard()),
		log: discard(), changes: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	a.start(ctx, c, startWatch(t, c, 0), slot, newWritesCounter(), "default")
	return a, slot
}

// evictPod is a plain pod on this node, changed by mod.
func evictPod(mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: remPod, Namespace: remNS, UID: remPodUID},
		Spec: corev1.PodSpec{NodeName: nodeName}}
	if mod != nil {
		mod(p)
	}
	return p
}

// evictions are the Eviction API requests c saw.
func evictions(c *fake.Clientset) []*policyv1.Eviction {
	var out []*policyv1.Eviction
	for _, a := range c.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "pods" && a.GetSubresource() == "eviction" {
			out = append(out, a.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction))
		}
	}
	return out
}

func TestRemediationEvict(t *testing.T) {
	grace := 30 * time.Second
	controlledBy := func(kind, name string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: "owner", Controller: new(true)}}
		}
	}
	tests := []struct {
		name  string
		pod   *corev1.Pod // nil: no such pod
		uid   string
		grace *time.Duration
		// evictErr is what the Eviction API answers (nil: it evicts).
		evictErr error
		// wantErr is the error Evict's must wrap (nil: no error), or
		// errAny for an error that is neither sentinel.
		wantErr   error
		wantEvict bool
		wantGrace *int64
	}{
		{name: "plain pod evicted with the pod's own grace", pod: evictPod(nil), wantEvict: true},
		{name: "plain pod evicted with a grace", pod: evictPod(nil), grace: &grace, wantEvict: true, wantGrace: new(int64(30))},
		{name: "plain pod evicted when its UID matches", pod: evictPod(nil), uid: remPodUID, wantEvict: true},
		{name: "a ReplicaSet's pod is evicted", pod: evictPod(controlledBy("ReplicaSet", "train")), wantEvict: true},
		{name: "a DaemonSet's pod is not", pod: evictPod(controlledBy("DaemonSet", "dcgm")), wantErr: remediate.ErrNotEvictable},
		{name: "a DaemonSet owner that is not the controller does not count",
			pod: evictPod(func(p *corev1.Pod) {
				p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ds", UID: "owner"}}
			}), wantEvict: true},
		{name: "the agent's own pod is not", pod: evictPod(func(p *corev1.Pod) { p.UID = remOwnPod }), wantErr: remediate.ErrNotEvictable},
		{name: "a mirror pod is not",
			pod:     evictPod(func(p *corev1.Pod) { p.Annotations = map[string]string{mirrorPodAnnotation: "abc"} }),
			wantErr: remediate.ErrNotEvictable},
		{name: "another node's pod is not", pod: evictPod(func(p *corev1.Pod) { p.Spec.NodeName = "gpu-node-2" }), wantErr: remediate.ErrNotEvictable},
		{name: "an unscheduled pod is not", pod: evictPod(func(p *corev1.Pod) { p.Spec.NodeName = "" }), wantErr: remediate.ErrNotEvictable},
		{name: "a PodDisruptionBudget refusing is ErrDisruptionBudget", pod: evictPod(nil),
			evictErr: apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 10),
			wantErr:  remediate.ErrDisruptionBudget, wantEvict: true},
		{name: "the pod gone before the eviction is done", pod: evictPod(nil),
			evictErr: apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, remPod), wantEvict: true},
		{name: "another eviction failure is an error", pod: evictPod(nil),
			evictErr: apierrors.NewInternalError(errors.New("etcd down")), wantErr: errAny, wantEvict: true},
		{name: "a pod that does not exist is done"},
		{name: "a pod of another UID is not the one asked for", pod: evictPod(nil), uid: "pod-uid-0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{testNode(nodeName)}
			if tc.pod != nil {
				objs = append(objs, tc.pod)
			}
			c := newFake(t, objs...)
			if tc.evictErr != nil {
				c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					return a.GetSubresource() == "eviction", nil, tc.evictErr
				})
			}
			a, _ := newTestRemediation(t, c)
			err := a.Evict(context.Background(), remNS, remPod, tc.uid, tc.grace)
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Evict = %v, want nil", err)
			case tc.wantErr == errAny:
				if err == nil || errors.Is(err, remediate.ErrNotEvictable) || errors.Is(err, remediate.ErrDisruptionBudget) {
					t.Fatalf("Evict = %v, want an error other than the sentinels", err)
				}
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("Evict = %v, want it to wrap %q", err, tc.wantErr)
			}
			got := evictions(c)
			if !tc.wantEvict {
				if len(got) != 0 {
					t.Fatalf("evictions requested: %+v, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("%d evictions requested, want 1", len(got))
			}
			ev := got[0]
			if ev.Name != remPod || ev.Namespace != remNS {
				t.Errorf("evicted %s/%s, want %s/%s", ev.Namespace, ev.Name, remNS, remPod)
			}
			do := ev.DeleteOptions
			if do == nil || do.Preconditions == nil || do.Preconditions.UID == nil || *do.Preconditions.UID != remPodUID {
				t.Fatalf("eviction delete options %+v: want the precondition UID %s", do, remPodUID)
			}
			switch {
			case tc.wantGrace == nil && do.GracePeriodSeconds != nil:
				t.Errorf("grace period %d, want the pod's own (unset)", *do.GracePeriodSeconds)
			case tc.wantGrace != nil && (do.GracePeriodSeconds == nil || *do.GracePeriodSeconds != *tc.wantGrace):
				t.Errorf("grace period %v, want %d", do.GracePeriodSeconds, *tc.wantGrace)
			}
		})
	}
}

// errAny stands for an error wrapping neither remediate sentinel.
var errAny = errors.New("any other error")

// slotLeases are the names of c's slot Leases held by nodeName.
func slotLeases(t *testing.T, c *fake.Clientset) []string {
	t.Helper()
	l, err := c.CoordinationV1().Leases(slotNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, lease := range l.Items {
		if h := lease.Spec.HolderIdentity; h != nil && *h == nodeName {
			out = append(out, lease.Name)
		}
	}
	return out
}

// TestRemediationAcquireSlot: remediation counts against the fleet
// safeguard as the taint does; a refusal says why.
func TestRemediationAcquireSlot(t *testing.T) {
	now := metav1.NewMicroTime(time.Now())
	other := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: safeguard.DefaultSlotPrefix + "-0", Namespace: slotNS,
			Labels: map[string]string{safeguard.SlotLabel: safeguard.DefaultSlotPrefix, safeguard.BucketLabel: "0"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: new("gpu-node-2"), LeaseDurationSeconds: new(int32(900)),
			AcquireTime: &now, RenewTime: &now},
	}
	tests := []struct {
		name        string
		objs        []runtime.Object
		wantHeld    bool
		wantRefusal string
	}{
		{name: "a free slot is taken", objs: []runtime.Object{testNode("gpu-node-2")}, wantHeld: true},
		{name: "the only slot is another node's",
			objs:        []runtime.Object{testNode("gpu-node-2"), other},
			wantRefusal: "1 of 1 slots are taken by other nodes (fleet size 2)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newFake(t, append([]runtime.Object{testNode(nodeName)}, tc.objs...)...)
			a, _ := newTestRemediation(t, c)
			held, why, err := a.AcquireSlot(context.Background())
			if err != nil || held != tc.wantHeld || why != tc.wantRefusal {
				t.Fatalf("AcquireSlot = %v, %q, %v; want %v, %q, nil", held, why, err, tc.wantHeld, tc.wantRefusal)
			}
			if got := len(slotLeases(t, c)) > 0; got != tc.wantHeld {
				t.Fatalf("this node holds a slot Lease: %v, want %v", got, tc.wantHeld)
			}
			if err := a.ReleaseSlot(context.Background()); err != nil {
				t.Fatal(err)
			}
			if leases := slotLeases(t, c); len(leases) != 0 {
				t.Fatalf("after ReleaseSlot this node's slot Leases are %v, want none", leases)
			}
		})
	}
}

// TestRemediationRefusalWords: a refusal says what the safeguard read,
// and an ask that read no slot says so rather than "0 of the 0".
func TestRemediationRefusalWords(t *testing.T) {
	for _, tc := range []struct {
		d    safeguard.Decision
		want string
	}{
		{safeguard.Decision{Slot: -1}, "every slot is taken"},
		{safeguard.Decision{Slot: -1, Limit: 2, Fleet: 10, Occupied: 2, Seen: 2}, "2 of 2 slots are taken by other nodes (fleet size 10)"},
		{safeguard.Decision{Slot: -1, Limit: 1500, Fleet: 7500, Occupied: 32, Seen: 32},
			"32 of the 32 slots read (of 1500) are taken by other nodes (fleet size 7500)"},
		{safeguard.Decision{Slot: -1, Limit: 1, Fleet: 3},
			"no slot of 1 was free when this node last read them; it reads again shortly (fleet size 3)"},
	} {
		if got := refusal(tc.d); got != tc.want {
			t.Errorf("refusal(%+v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

// conditionPatches are the patches of the Node's status c saw.
func conditionPatches(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "nodes" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

func TestRemediationSetCondition(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	a, _ := newTestRemediation(t, c)
	steps := []struct {
		name     string
		required bool
		reason   string
		// wantStatus is the condition's status after the step ("": absent).
		wantStatus corev1.ConditionStatus
		wantPatch  bool
	}{
		{name: "not required and absent: nothing written", reason: "NotRequired"},
		{name: "required: written True", required: true, reason: "ResetFailed", wantStatus: corev1.ConditionTrue, wantPatch: true},
		{name: "required again: unchanged", required: true, reason: "ResetFailed", wantStatus: corev1.ConditionTrue},
		{name: "no longer required: written False", reason: "Rebooted", wantStatus: corev1.ConditionFalse, wantPatch: true},
		{name: "not required and False: unchanged", reason: "Rebooted", wantStatus: corev1.ConditionFalse},
	}
	for _, s := range steps {
		before := conditionPatches(c)
		if err := a.SetCondition(context.Background(), remCondType, s.required, s.reason, "message of "+s.reason); err != nil {
			t.Fatalf("%s: SetCondition: %v", s.name, err)
		}
		if got := conditionPatches(c) - before; got != map[bool]int{false: 0, true: 1}[s.wantPatch] {
			t.Errorf("%s: %d status patches, want patched=%v", s.name, got, s.wantPatch)
		}
		cond := findCondition(getNode(t, c), remCondType)
		switch {
		case s.wantStatus == "" && cond != nil:
			t.Fatalf("%s: condition %+v written, want none", s.name, *cond)
		case s.wantStatus == "":
		case cond == nil:
			t.Fatalf("%s: no condition %s, want %s", s.name, remCondType, s.wantStatus)
		case cond.Status != s.wantStatus || cond.Reason != s.reason || cond.Message != "message of "+s.reason:
			t.Fatalf("%s: condition %s=%s %s: %q, want %s %s", s.name, remCondType, cond.Status, cond.Reason, cond.Message, s.wantStatus, s.reason)
		}
	}
	if cs := getNode(t, c).Status.Conditions; len(cs) != 1 {
		t.Errorf("node conditions %+v, want only %s", cs, remCondType)
	}
}

func TestRemediationPaused(t *testing.T) {
	tests := []struct {
		name        string
		annotations map[string]string
		want        bool
	}{
		{name: "no annotation"},
		{name: "paused", annotations: map[string]string{remediate.PauseAnnotation: "true"}, want: true},
		{name: "explicitly not paused", annotations: map[string]string{remediate.PauseAnnotation: "false"}},
		{name: "another annotation", annotations: map[string]string{"gpu-node-agent.io/other": "true"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := testNode(nodeName)
			n.Annotations = tc.annotations
			c := newFake(t, n)
			a, _ := newTestRemediation(t, c)
			before := len(c.Actions())
			got, err := a.Paused(context.Background())
			if err != nil || got != tc.want {
				t.Fatalf("Paused = %v, %v; want %v", got, err, tc.want)
			}
			if extra := c.Actions()[before:]; len(extra) != 0 {
				t.Errorf("Paused made requests %v; want it read the informer's cache", extra)
			}
		})
	}
}

// TestRemediationPauseChanges: setting the annotation signals Changes,
// after which Paused says so.
func TestRemediationPauseChanges(t *testing.T) {
	c := newFake(t, testNode(nodeName))
	a, _ := newTestRemediation(t, c)
	select {
	case <-a.Changes(): // start signals once: read the state
	case <-time.After(10 * time.Second):
		t.Fatal("no change signalled at start")
	}
	modifyNode(t, c, func(n *corev1.Node) {
		n.Annotations = map[string]string{remediate.PauseAnnotation: "true"}
	})
	testutil.WaitFor(t, "the pause to be seen", func() bool {
		select {
		case <-a.Changes():
		case <-time.After(10 * time.Second):
			t.Fatal("no change signalled after the annotation was set")
		}
		p, err := a.Paused(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return p
	})
}

// TestRemediationNotReady: before NodeObject.Run starts it, every call
// that needs the API server is ErrNotReady and makes no request.
func TestRemediationNotReady(t *testing.T) {
	a := &RemediationAPI{ownPod: remOwnPod, events: newNodeEvents(nodeName, "default", false, discard()),
		log: discard(), changes: make(chan struct{}, 1)}
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
	}{
		{"Paused", func() error { _, err := a.Paused(ctx); return err }},
		{"AcquireSlot", func() error { _, _, err := a.AcquireSlot(ctx); return err }},
		{"ReleaseSlot", func() error { return a.ReleaseSlot(ctx) }},
		{"Evict", func() error { return a.Evict(ctx, remNS, remPod, remPodUID, nil) }},
		{"SetCondition", func() error { return a.SetCondition(ctx, remCondType, true, "ResetFailed", "") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ErrNotReady) {
				t.Fatalf("%s before start = %v, want ErrNotReady", tc.name, err)
			}
		})
	}
	// Events queue until the poster runs; they never block.
	a.Event(corev1.EventTypeNormal, "Test", "before start")
	select {
	case <-a.Changes():
		t.Fatal("a change was signalled before start")
	default:
	}
}

var _ remediate.Cluster = (*RemediationAPI)(nil)

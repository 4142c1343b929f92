package kubeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// adviceNode is a DGX H100 whose GPU 1 is in MIG mode with one 1g.10gb
// device.
func adviceNode(t *testing.T) *topology.Node {
	t.Helper()
	n := loadProfile(t, "dgx-h100")
	n.GPUs[1].MIGEnabled = true
	n.GPUs[1].MIG = []topology.MIGDevice{{UUID: "MIG-7a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d", Profile: "1g.10gb"}}
	return n
}

func ptr[T any](v T) *T { return &v }

// TestMoveAdviceValue: the annotation is compact JSON in the documented
// shape: each pod's GPUs by index (a replica and a MIG device count as
// their GPU, an RDMA device as none), pods by namespace then name,
// priority and ownerKind only for pods that were read (an ownerKind of
// "" kept: a bare pod); no advice, no annotation.
func TestMoveAdviceValue(t *testing.T) {
	n := adviceNode(t)
	g := func(i int) string { return n.GPUs[i].UUID }
	advice := topology.MoveAdvice{BlockNow: 4, BlockIfMoved: 6, WholeNode: true, Block: []int{0, 2, 3, 4, 5, 6},
		Pods: []topology.PodHold{
			{Namespace: "ml", Name: "train", Devices: []string{g(3), g(0) + "::1", "mlx5_0"}},
			{Namespace: "ml", Name: "bare", Devices: []string{g(6)}},
			{Namespace: "infer", Name: "small", Devices: []string{n.GPUs[1].MIG[0].UUID, g(5)}},
		}}
	details := map[string]podDetail{
		"ml/train": {uid: "u1", priority: 1000, ownerKind: "Job"},
		"ml/bare":  {uid: "u2", priority: 0, ownerKind: ""},
	}
	in := &adviceInput{node: n, advice: advice}
	got := renderAdvice(in, details)
	want := `{"blockNow":4,"blockIfMoved":6,"wholeNode":true,"gpus":[0,2,3,4,5,6],"pods":[` +
		`{"namespace":"infer","name":"small","gpus":[1,5]},` +
		`{"namespace":"ml","name":"bare","priority":0,"ownerKind":"","gpus":[6]},` +
		`{"namespace":"ml","name":"train","priority":1000,"ownerKind":"Job","gpus":[0,3]}]}`
	if got != want {
		t.Errorf("annotation\n got %s\nwant %s", got, want)
	}
	var back MoveAdvice
	if err := json.Unmarshal([]byte(got), &back); err != nil {
		t.Fatalf("the value does not decode as MoveAdvice: %v", err)
	}
	if back.Pods[0].Priority != nil || back.Pods[2].OwnerKind == nil || *back.Pods[2].OwnerKind != "Job" {
		t.Errorf("decoded %+v", back)
	}
	// Without details the shape is the same, details left out.
	if bare := renderAdvice(in, nil); strings.Contains(bare, "priority") || strings.Contains(bare, "ownerKind") ||
		!strings.Contains(bare, `{"namespace":"ml","name":"train","gpus":[0,3]}`) {
		t.Errorf("without details: %s", bare)
	}
	for name, in := range map[string]*adviceInput{
		"nothing yet":         nil,
		"no node":             {advice: advice},
		"wholly free":         {node: n, advice: topology.MoveAdvice{BlockNow: 7, BlockIfMoved: 7, WholeNode: true}},
		"no larger block":     {node: n, advice: topology.MoveAdvice{BlockNow: 2, BlockIfMoved: 2}},
		"empty pods, a block": {node: n, advice: topology.MoveAdvice{BlockNow: 2, BlockIfMoved: 4, Block: []int{0, 1, 2, 3}, Pods: []topology.PodHold{}}},
	} {
		if v := renderAdvice(in, details); v != "" {
			t.Errorf("%s: annotation %q, want none", name, v)
		}
	}
}

// TestMoveAdvicePodDetails: priority as the scheduler takes it (none is
// 0) and the controller's kind, a mirror pod's being Node.
func TestMoveAdvicePodDetails(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name     string
		pod      corev1.Pod
		priority int32
		kind     string
	}{
		{name: "bare pod, no priority", pod: corev1.Pod{}, kind: ""},
		{name: "job's pod", pod: corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "train", Controller: &yes}}},
			Spec:       corev1.PodSpec{Priority: ptr[int32](1000)}}, priority: 1000, kind: "Job"},
		{name: "owner that is not the controller", pod: corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: "ConfigMap", Name: "x", Controller: &no}}},
			Spec:       corev1.PodSpec{Priority: ptr[int32](-5)}}, priority: -5, kind: ""},
		{name: "mirror pod", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Annotations:     map[string]string{mirrorPodAnnotation: "abc"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "gpu-node-1", Controller: &yes}}}},
			kind: "Node"},
		{name: "mirror pod without an owner", pod: corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Annotations: map[string]string{mirrorPodAnnotation: "abc"}}}, kind: "Node"},
	}
	for _, tc := range tests {
		if p, k := podPriority(&tc.pod), ownerKind(&tc.pod); p != tc.priority || k != tc.kind {
			t.Errorf("%s: priority %d, owner kind %q; want %d, %q", tc.name, p, k, tc.priority, tc.kind)
		}
	}
}

// adviceRig runs a NodeObject with the move advice on a fake API server
// and a fake clock.
type adviceRig struct {
	t      *testing.T
	client *fake.Clientset
	clock  *clocktesting.FakeClock
	obj    *NodeObject
	node   *topology.Node
}

func newAdviceRig(t *testing.T, labels bool, objs ...runtime.Object) *adviceRig {
	t.Helper()
	return newAdviceRigOn(t, labels, newFake(t, objs...))
}

// newAdviceRigOn is newAdviceRig on client, whose reactors are set before
// the node object runs.
func newAdviceRigOn(t *testing.T, labels bool, client *fake.Clientset) *adviceRig {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	obj := NewNodeObject(NodeObjectConfig{
		NodeName: nodeName, Taint: TaintConfig{Mode: TaintOff}, Labels: labels, MoveAdvice: true, Clock: clk,
		NewClients: func() (Clients, error) { return fakeClients(t, client), nil },
	}, newFakeHealth(health.Fitness{Fit: true}), nil, discard())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = obj.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &adviceRig{t: t, client: client, clock: clk, obj: obj, node: adviceNode(t)}
}

// set hands the rig's node object an advice to move pods (namespace ml)
// off GPUs, and waits until the advisor has handled it (which may mean
// waiting for the interval: then until it waits on the clock).
func (r *adviceRig) set(blockNow int, pods map[string][]int, uids map[string]string) {
	r.t.Helper()
	adv := topology.MoveAdvice{BlockNow: blockNow, BlockIfMoved: blockNow}
	if len(pods) > 0 {
		adv.BlockIfMoved, adv.WholeNode = 7, true
		adv.Block = []int{0, 2, 3, 4, 5, 6, 7}
	}
	for _, name := range sortedKeys(pods) {
		h := topology.PodHold{Namespace: "ml", Name: name}
		for _, i := range pods[name] {
			h.Devices = append(h.Devices, r.node.GPUs[i].UUID)
		}
		adv.Pods = append(adv.Pods, h)
	}
	before := r.obj.advice.rounds.Load()
	r.obj.SetMoveAdvice(r.node, adv, uids)
	testutil.WaitFor(r.t, "the advisor's round", func() bool {
		return r.obj.advice.rounds.Load() > before || r.clock.HasWaiters()
	})
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// annotation is the Node's move advice ("" when absent).
func (r *adviceRig) annotation() string {
	return getNode(r.t, r.client).Annotations[MoveAdviceAnnotation]
}

// advicePatches counts the Node patches that carry the move advice, and
// pod GETs.
func (r *adviceRig) requests() (patches, podGets int) {
	for _, a := range r.client.Actions() {
		switch a := a.(type) {
		case k8stesting.PatchAction:
			if a.GetResource().Resource == "nodes" && bytes.Contains(a.GetPatch(), []byte(MoveAdviceAnnotation)) {
				patches++
			}
		case k8stesting.GetAction:
			if a.GetResource().Resource == "pods" {
				podGets++
			}
		}
	}
	return patches, podGets
}

func (r *adviceRig) decoded() MoveAdvice {
	r.t.Helper()
	var v MoveAdvice
	if err := json.Unmarshal([]byte(r.annotation()), &v); err != nil {
		r.t.Fatalf("annotation %q: %v", r.annotation(), err)
	}
	return v
}

func trainPod(name string, priority int32, owner string) *corev1.Pod {
	yes := true
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: nodeName, Priority: &priority}}
	if owner != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: owner, Name: name + "-owner", Controller: &yes}}
	}
	return p
}

// TestMoveAdviceAnnotationLifecycle runs the node object with labels on
// but no discovery ever complete: the advice is written anyway, and no
// label with it. The pods it names are read once each while they stay in
// it; an unchanged advice costs no request; a pod that cannot be read is
// named without its details and read again with the next advice; no
// advice removes the annotation.
func TestMoveAdviceAnnotationLifecycle(t *testing.T) {
	r := newAdviceRig(t, true,
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"team": "ml"}}},
		trainPod("a", 100, "Job"), trainPod("b", 0, ""))

	r.set(5, map[string][]int{"a": {0}, "b": {1}}, map[string]string{"ml/a": "uid-a"})
	testutil.WaitFor(t, "the move advice on the Node", func() bool { return r.annotation() != "" })
	v := r.decoded()
	if v.BlockNow != 5 || v.BlockIfMoved != 7 || !v.WholeNode || len(v.Pods) != 2 {
		t.Fatalf("advice %+v", v)
	}
	if a := v.Pods[0]; a.Name != "a" || a.Priority == nil || *a.Priority != 100 || a.OwnerKind == nil || *a.OwnerKind != "Job" {
		t.Errorf("pod a: %+v", a)
	}
	if b := v.Pods[1]; b.Name != "b" || b.Priority == nil || *b.Priority != 0 || b.OwnerKind == nil || *b.OwnerKind != "" {
		t.Errorf("pod b: %+v", b)
	}
	for _, act := range r.client.Actions() {
		if p, ok := act.(k8stesting.PatchAction); ok && bytes.Contains(p.GetPatch(), []byte(`"labels"`)) {
			t.Errorf("a label patch with no complete discovery: %s", p.GetPatch())
		}
	}
	patches, gets := r.requests()
	if patches != 1 || gets != 2 {
		t.Fatalf("%d advice patches and %d pod GETs, want 1 and 2", patches, gets)
	}

	// The same advice again: nothing read, nothing written.
	r.clock.Step(MoveAdviceInterval)
	r.set(5, map[string][]int{"a": {0}, "b": {1}}, map[string]string{"ml/a": "uid-a"})
	if p, g := r.requests(); p != patches || g != gets {
		t.Errorf("unchanged advice: %d patches and %d GETs more, want none", p-patches, g-gets)
	}

	// Pod c is new and not there to read: named without details. a and b
	// come from memory.
	r.set(4, map[string][]int{"a": {0}, "b": {1}, "c": {2}}, nil)
	testutil.WaitFor(t, "pod c in the advice", func() bool { return strings.Contains(r.annotation(), `"name":"c"`) })
	if c := r.decoded().Pods[2]; c.Priority != nil || c.OwnerKind != nil {
		t.Errorf("unreadable pod c has details: %+v", c)
	}
	if _, g := r.requests(); g != gets+1 {
		t.Errorf("%d pod GETs, want only c's", g-gets)
	}

	// c appears; the next advice reads it again.
	if _, err := r.client.CoreV1().Pods("ml").Create(context.Background(), trainPod("c", 7, "StatefulSet"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.clock.Step(MoveAdviceInterval)
	r.set(3, map[string][]int{"a": {0}, "b": {1}, "c": {2}}, nil)
	testutil.WaitFor(t, "pod c's details", func() bool { return strings.Contains(r.annotation(), `"ownerKind":"StatefulSet"`) })
	if _, g := r.requests(); g != gets+2 {
		t.Errorf("%d pod GETs, want c's two", g-gets)
	}

	// No advice: the annotation goes, the foreign label stays.
	r.clock.Step(MoveAdviceInterval)
	r.set(7, nil, nil)
	testutil.WaitFor(t, "the annotation removed", func() bool { return r.annotation() == "" })
	if n := getNode(t, r.client); n.Labels["team"] != "ml" || len(n.Labels) != 1 {
		t.Errorf("labels %v, want only the foreign one", n.Labels)
	}
}

// TestMoveAdviceCoalesces: pod churn of many advice changes within
// MoveAdviceInterval becomes one write of the latest advice when the
// interval ends, not a PATCH per change.
func TestMoveAdviceCoalesces(t *testing.T) {
	r := newAdviceRig(t, false, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, trainPod("a", 0, "Job"))
	r.set(6, map[string][]int{"a": {0}}, nil)
	testutil.WaitFor(t, "the first advice on the Node", func() bool { return r.annotation() != "" })
	first := r.annotation()

	// 100 changes (pods coming and going) within the interval.
	for i := range 100 {
		r.obj.SetMoveAdvice(r.node, topology.MoveAdvice{BlockNow: i % 7, BlockIfMoved: 7, WholeNode: true,
			Pods: []topology.PodHold{{Namespace: "ml", Name: "a", Devices: []string{r.node.GPUs[0].UUID}}}}, nil)
	}
	r.set(2, map[string][]int{"a": {0}}, nil)
	testutil.WaitFor(t, "the advisor waiting for the interval", r.clock.HasWaiters)
	if got := r.annotation(); got != first {
		t.Errorf("annotation changed within the interval: %s", got)
	}
	if p, _ := r.requests(); p != 1 {
		t.Errorf("%d advice patches within the interval, want the first only", p)
	}
	r.clock.Step(MoveAdviceInterval)
	testutil.WaitFor(t, "the latest advice written", func() bool { return r.decoded().BlockNow == 2 })
	before := r.obj.advice.rounds.Load()
	testutil.WaitFor(t, "the advisor idle", func() bool {
		return r.obj.advice.rounds.Load() > before || len(r.obj.advice.kick) == 0 && !r.clock.HasWaiters()
	})
	if p, _ := r.requests(); p != 2 {
		t.Errorf("%d advice patches for 101 changes, want 2 (the first, then the latest after the interval)", p)
	}
	if _, g := r.requests(); g != 1 {
		t.Errorf("%d pod GETs, want pod a's one", g)
	}
}

// TestMoveAdviceRestart: a restarted agent leaves an earlier run's advice
// on the Node until it knows its own (its labels are applied meanwhile),
// then replaces or removes it; with the advice off, the labeler removes
// it.
func TestMoveAdviceRestart(t *testing.T) {
	stale := `{"blockNow":1,"blockIfMoved":2,"wholeNode":false,"gpus":[0,1],"pods":[]}`
	node := func() *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{MoveAdviceAnnotation: stale}}}
	}
	t.Run("advice on", func(t *testing.T) {
		r := newAdviceRig(t, true, node())
		r.obj.SetNode(r.node)
		testutil.WaitFor(t, "the labels", func() bool { return getNode(t, r.client).Labels[topology.LabelGPUCount] != "" })
		if got := r.annotation(); got != stale {
			t.Errorf("advice annotation %q before the first advice, want the earlier run's kept", got)
		}
		r.set(8, nil, nil)
		testutil.WaitFor(t, "the stale advice removed", func() bool { return r.annotation() == "" })
	})
	t.Run("advice off", func(t *testing.T) {
		client := newFake(t, node())
		obj := NewNodeObject(NodeObjectConfig{NodeName: nodeName, Taint: TaintConfig{Mode: TaintOff}, Labels: true,
			NewClients: func() (Clients, error) { return fakeClients(t, client), nil }}, newFakeHealth(health.Fitness{Fit: true}), nil, discard())
		obj.SetMoveAdvice(adviceNode(t), topology.MoveAdvice{BlockNow: 1, Pods: []topology.PodHold{{Namespace: "ml", Name: "a"}}}, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = obj.Run(ctx); close(done) }()
		defer func() { cancel(); <-done }()
		obj.SetNode(adviceNode(t))
		testutil.WaitFor(t, "the stale advice removed with the labels", func() bool {
			n := getNode(t, client)
			return n.Labels[topology.LabelGPUCount] != "" && n.Annotations[MoveAdviceAnnotation] == ""
		})
		for _, a := range client.Actions() {
			if a.GetResource().Resource == "pods" {
				t.Errorf("advice off, yet a pod request: %s", a.GetVerb())
			}
		}
	})
}

// TestMoveAdviceForbiddenGet: a pod GET the API server refuses (no RBAC)
// leaves the pod's details out and never holds the advice back.
func TestMoveAdviceForbiddenGet(t *testing.T) {
	client := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, trainPod("a", 5, "Job"))
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "a", nil)
	})
	r := newAdviceRigOn(t, false, client)
	r.set(6, map[string][]int{"a": {0}}, nil)
	testutil.WaitFor(t, "the advice on the Node", func() bool { return r.annotation() != "" })
	if a := r.decoded().Pods[0]; a.Name != "a" || a.Priority != nil || a.OwnerKind != nil {
		t.Errorf("pod a: %+v, want it named without details", a)
	}
}

package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
)

const sliceNode = "gpu-node-1"

func sliceNodeObject() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: sliceNode, UID: "node-uid-1"}}
}

// testDevices are n devices named gpu-0... with one attribute each.
func testDevices(n int) []resourcev1.Device {
	out := make([]resourcev1.Device, n)
	for i := range out {
		out[i] = resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"index": {IntValue: ptr.To(int64(i))}}}
	}
	return out
}

func tainted(devs []resourcev1.Device, i int, cause string) []resourcev1.Device {
	out := make([]resourcev1.Device, len(devs))
	for j := range devs {
		devs[j].DeepCopyInto(&out[j])
	}
	out[i].Taints = []resourcev1.DeviceTaint{{Key: "gpu-node-agent.io/unhealthy", Value: cause,
		Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	return out
}

type publisherRun struct {
	p   *SlicePublisher
	reg *prometheus.Registry
}

// startPublisher runs a SlicePublisher of sliceNode on c until stop (or
// the test's end) and waits for its informer's first list.
func startPublisher(t *testing.T, c *fake.Clientset) (*publisherRun, func()) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := NewSlicePublisher(c, SlicePublisherConfig{NodeName: sliceNode}, discard(), reg)
	if err != nil {
		t.Fatal(err)
	}
	p.backoff = wait.Backoff{Duration: time.Millisecond, Factor: 2, Jitter: 1, Cap: 10 * time.Millisecond, Steps: 1 << 30}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	var once atomic.Bool
	stop := func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	waitFor(t, "the slice informer's first list", p.informer.HasSynced)
	return &publisherRun{p: p, reg: reg}, stop
}

// publish sets devs and waits until the API server holds them and the
// informer has delivered every write; then it sets devs again and waits
// for that reconcile, which compares with the informer's complete view:
// every write the publisher would make for devs has been made.
func (r *publisherRun) publish(t *testing.T, devs []resourcev1.Device) {
	t.Helper()
	r.p.Set(devs)
	waitFor(t, "the devices published and delivered", func() bool {
		r.p.mu.Lock()
		defer r.p.mu.Unlock()
		return r.p.haveDesired && r.p.done == r.p.version && len(r.p.written) == 0
	})
	r.p.Set(devs)
	waitFor(t, "the devices published again", r.p.Published)
}

// sliceWrites are the create, update and delete actions on ResourceSlices
// since mark, as "verb name" (a create by its generateName).
func sliceWrites(c *fake.Clientset, mark int) []string {
	var out []string
	for _, a := range c.Actions()[mark:] {
		if a.GetResource().Resource != "resourceslices" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			out = append(out, "create "+a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceSlice).GenerateName)
		case "update":
			out = append(out, "update "+a.(k8stesting.UpdateAction).GetObject().(*resourcev1.ResourceSlice).Name)
		case "delete":
			out = append(out, "delete "+a.(k8stesting.DeleteAction).GetName())
		}
	}
	return out
}

func storedSlices(t *testing.T, c *fake.Clientset) []resourcev1.ResourceSlice {
	t.Helper()
	l, err := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// checkPool checks the stored slices are the pool of want: one slice per
// dra.Split chunk, named by index, one generation, the devices in order.
func checkPool(t *testing.T, c *fake.Clientset, want []resourcev1.Device) int64 {
	t.Helper()
	chunks := dra.Split(want)
	got := storedSlices(t, c)
	if len(got) != len(chunks) {
		t.Fatalf("%d slices stored, want %d", len(got), len(chunks))
	}
	gen := got[0].Spec.Pool.Generation
	for _, s := range got {
		i, ok := decodeIndex(s.Name, minIndexLength)
		if !ok || i >= len(chunks) {
			t.Fatalf("slice %s: no index of the pool", s.Name)
		}
		prefix := slicePrefix(i)
		if !strings.HasPrefix(s.Name, prefix) {
			t.Errorf("slice %s: want name prefix %s", s.Name, prefix)
		}
		if s.Spec.Driver != dra.DriverName || ptr.Deref(s.Spec.NodeName, "") != sliceNode {
			t.Errorf("slice %s: driver %q node %v", s.Name, s.Spec.Driver, s.Spec.NodeName)
		}
		wantPool := resourcev1.ResourcePool{Name: sliceNode, Generation: gen, ResourceSliceCount: int64(len(chunks))}
		if s.Spec.Pool != wantPool {
			t.Errorf("slice %s: pool %+v, want %+v", s.Name, s.Spec.Pool, wantPool)
		}
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "node-uid-1" || s.OwnerReferences[0].Kind != "Node" ||
			!ptr.Deref(s.OwnerReferences[0].Controller, false) {
			t.Errorf("slice %s: owner references %+v, want the Node as controller", s.Name, s.OwnerReferences)
		}
		if !devicesEqual(s.Spec.Devices, chunks[i]) {
			t.Errorf("slice %s: devices differ from chunk %d", s.Name, i)
		}
	}
	return gen
}

func sliceName(t *testing.T, c *fake.Clientset, index int) string {
	t.Helper()
	for _, s := range storedSlices(t, c) {
		if i, ok := decodeIndex(s.Name, minIndexLength); ok && i == index {
			return s.Name
		}
	}
	t.Fatalf("no slice %d stored", index)
	return ""
}

// slicePrefix is the generateName of sliceNode's slice i.
func slicePrefix(i int) string {
	return encodeIndex(i, minIndexLength) + "-" + dra.DriverName + "-" + sliceNode + "-"
}

func equalWrites(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: writes\n  %s\nwant\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestSlicePublisherWritesOnlyChanges(t *testing.T) {
	c := newFake(t, sliceNodeObject())
	r, _ := startPublisher(t, c)
	prefix := slicePrefix

	devs := testDevices(70) // two slices: 64 + 6
	mark := len(c.Actions())
	r.publish(t, devs)
	equalWrites(t, "first publish", sliceWrites(c, mark), "create "+prefix(0), "create "+prefix(1))
	if gen := checkPool(t, c, devs); gen != 1 {
		t.Errorf("first generation %d, want 1", gen)
	}

	// Steady state: equal content, set again and again (as every health or
	// metric tick would), writes nothing.
	mark = len(c.Actions())
	for range 100 {
		r.publish(t, testDevices(70))
	}
	equalWrites(t, "100 equal sets", sliceWrites(c, mark))

	// One device's taint: one update, of its slice only; the generation
	// stays (at most one update).
	second := sliceName(t, c, 1)
	mark = len(c.Actions())
	withTaint := tainted(devs, 66, "xid-79")
	r.publish(t, withTaint)
	equalWrites(t, "taint on gpu-66", sliceWrites(c, mark), "update "+second)
	if gen := checkPool(t, c, withTaint); gen != 1 {
		t.Errorf("generation after one update %d, want 1", gen)
	}
	// The same taint again is no write; its removal is one update.
	mark = len(c.Actions())
	r.publish(t, tainted(devs, 66, "xid-79"))
	r.publish(t, devs)
	equalWrites(t, "same taint, then removed", sliceWrites(c, mark), "update "+second)

	// A device removed from the second slice: one update.
	mark = len(c.Actions())
	r.publish(t, devs[:69])
	equalWrites(t, "gpu-69 removed", sliceWrites(c, mark), "update "+second)
	checkPool(t, c, devs[:69])

	// Down to one slice: the second deleted, the first updated (slice
	// count). One update keeps the generation (the library's rule: the
	// deleted slice leaves no device behind that the scheduler could
	// mistake for current).
	first := sliceName(t, c, 0)
	mark = len(c.Actions())
	r.publish(t, devs[:64])
	equalWrites(t, "down to 64 devices", sliceWrites(c, mark), "delete "+second, "update "+first)
	if gen := checkPool(t, c, devs[:64]); gen != 1 {
		t.Errorf("generation after a slice removed %d, want 1", gen)
	}

	// A device added: a second slice again, under a new generation.
	mark = len(c.Actions())
	r.publish(t, devs[:65])
	equalWrites(t, "gpu-64 added", sliceWrites(c, mark), "update "+first, "create "+prefix(1))
	if gen := checkPool(t, c, devs[:65]); gen != 2 {
		t.Errorf("generation after a slice added %d, want 2", gen)
	}

	// No devices: no slices.
	second = sliceName(t, c, 1)
	mark = len(c.Actions())
	r.publish(t, nil)
	equalWrites(t, "no devices", sliceWrites(c, mark), "delete "+first, "delete "+second)
	if n := len(storedSlices(t, c)); n != 0 {
		t.Errorf("%d slices left", n)
	}

	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(`
# HELP gpu_node_agent_dra_resourceslice_writes_total ResourceSlice writes the DRA slice publisher made to the Kubernetes API, by verb (create, update, delete).
# TYPE gpu_node_agent_dra_resourceslice_writes_total counter
gpu_node_agent_dra_resourceslice_writes_total{verb="create"} 3
gpu_node_agent_dra_resourceslice_writes_total{verb="delete"} 3
gpu_node_agent_dra_resourceslice_writes_total{verb="update"} 5
`), "gpu_node_agent_dra_resourceslice_writes_total"); err != nil {
		t.Error(err)
	}
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(mfs).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %v", problems, err)
	}
}

// TestSlicePublisherRepairs: a slice deleted or changed by someone else is
// written again, from the informer's event, with no Set.
func TestSlicePublisherRepairs(t *testing.T) {
	c := newFake(t, sliceNodeObject())
	r, _ := startPublisher(t, c)
	devs := testDevices(70)
	r.publish(t, devs)
	first, second := sliceName(t, c, 0), sliceName(t, c, 1)

	mark := len(c.Actions())
	if err := c.ResourceV1().ResourceSlices().Delete(context.Background(), second, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted slice recreated", func() bool { return len(storedSlices(t, c)) == 2 })
	r.publish(t, devs)
	// A new slice bumps the generation, so the first is updated too (the
	// library's rule).
	equalWrites(t, "slice deleted by someone else", sliceWrites(c, mark)[1:],
		"update "+first, "create "+slicePrefix(1))
	checkPool(t, c, devs)

	// Someone rewrites the first slice's devices: it is rewritten.
	s, err := c.ResourceV1().ResourceSlices().Get(context.Background(), first, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Devices = s.Spec.Devices[:10]
	mark = len(c.Actions())
	if _, err := c.ResourceV1().ResourceSlices().Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the changed slice rewritten", func() bool {
		return len(sliceWrites(c, mark)) == 2
	})
	r.publish(t, devs)
	equalWrites(t, "slice changed by someone else", sliceWrites(c, mark), "update "+first, "update "+first)
	checkPool(t, c, devs)
}

// TestSlicePublisherAdoptsAfterRestart: a new publisher over the slices a
// previous one wrote rewrites none that are right, and updates only the
// one that changed while it was down.
func TestSlicePublisherAdoptsAfterRestart(t *testing.T) {
	c := newFake(t, sliceNodeObject())
	r, stop := startPublisher(t, c)
	devs := testDevices(70)
	r.publish(t, devs)
	equalWrites(t, "first publish", sliceWrites(c, 0), "create "+slicePrefix(0), "create "+slicePrefix(1))
	if gen := checkPool(t, c, devs); gen != 1 {
		t.Errorf("first publish: generation %d, want 1", gen)
	}
	stop()

	r2, stop2 := startPublisher(t, c)
	mark := len(c.Actions())
	r2.publish(t, testDevices(70))
	equalWrites(t, "restart with equal devices", sliceWrites(c, mark))
	stop2()

	r3, _ := startPublisher(t, c)
	mark = len(c.Actions())
	r3.publish(t, tainted(devs, 3, "xid-48"))
	equalWrites(t, "restart with a taint", sliceWrites(c, mark), "update "+sliceName(t, c, 0))
	if gen := checkPool(t, c, tainted(devs, 3, "xid-48")); gen != 1 {
		t.Errorf("generation %d, want 1", gen)
	}
}

// TestSlicePublisherRetries: a refused write is retried (with backoff)
// until it succeeds; a Conflict on update is retried after the informer
// delivers the newer slice.
func TestSlicePublisherRetries(t *testing.T) {
	c := newFake(t, sliceNodeObject())
	var refused atomic.Int32
	c.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refused.Add(1) <= 3 {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is away"))
		}
		return false, nil, nil
	})
	var conflicts atomic.Int32
	c.PrependReactor("update", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) == 1 {
			return true, nil, apierrors.NewConflict(resourcev1.Resource("resourceslices"), "x", errors.New("modified"))
		}
		return false, nil, nil
	})
	r, _ := startPublisher(t, c)
	devs := testDevices(3)
	r.publish(t, devs)
	checkPool(t, c, devs)
	r.publish(t, tainted(devs, 1, "xid-79"))
	checkPool(t, c, tainted(devs, 1, "xid-79"))
	if got := conflicts.Load(); got != 2 {
		t.Errorf("%d updates tried, want 2 (one conflict, one retry)", got)
	}
	if err := testutil.GatherAndCompare(r.reg, strings.NewReader(`
# HELP gpu_node_agent_dra_resourceslice_write_failures_total ResourceSlice writes of the DRA slice publisher the Kubernetes API refused or did not answer, by verb.
# TYPE gpu_node_agent_dra_resourceslice_write_failures_total counter
gpu_node_agent_dra_resourceslice_write_failures_total{verb="create"} 3
gpu_node_agent_dra_resourceslice_write_failures_total{verb="delete"} 0
gpu_node_agent_dra_resourceslice_write_failures_total{verb="update"} 1
`), "gpu_node_agent_dra_resourceslice_write_failures_total"); err != nil {
		t.Error(err)
	}
}

// TestSlicePublisherWaitsForFirstSet: before the first Set the publisher
// leaves existing slices alone (a starting agent does not yet know its
// devices).
func TestSlicePublisherWaitsForFirstSet(t *testing.T) {
	c := newFake(t, sliceNodeObject())
	r, stop := startPublisher(t, c)
	r.publish(t, testDevices(2))
	stop()
	mark := len(c.Actions())
	r2, _ := startPublisher(t, c)
	// What Run does when woken (by the informer's events) before a Set.
	if err := r2.p.reconcile(t.Context()); err != nil {
		t.Fatal(err)
	}
	if r2.p.Published() {
		t.Error("published before any Set")
	}
	equalWrites(t, "no Set", sliceWrites(c, mark))
	if n := len(storedSlices(t, c)); n != 1 {
		t.Errorf("%d slices, want the 1 left", n)
	}
}

func TestDevicesEqualIgnoresServerTimeAdded(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 600e6, time.UTC))
	want := tainted(testDevices(2), 1, "xid-79")
	stored := tainted(testDevices(2), 1, "xid-79")
	stored[1].Taints[0].TimeAdded = &now
	if !devicesEqual(stored, want) {
		t.Error("a server-set TimeAdded made devices differ")
	}
	other := tainted(testDevices(2), 1, "xid-48")
	if devicesEqual(stored, other) {
		t.Error("another taint value compared equal")
	}
	later := tainted(testDevices(2), 1, "xid-79")
	later[1].Taints[0].TimeAdded = &metav1.Time{Time: now.Add(time.Minute)}
	if devicesEqual(stored, later) {
		t.Error("TimeAdded a minute apart compared equal")
	}
	kept := keepTaintTimeAdded(stored, want)
	if kept[1].Taints[0].TimeAdded == nil || !kept[1].Taints[0].TimeAdded.Equal(&now) {
		t.Errorf("update loses the stored TimeAdded: %+v", kept[1].Taints)
	}
	if want[1].Taints[0].TimeAdded != nil {
		t.Error("keepTaintTimeAdded changed its input")
	}
	if kept := keepTaintTimeAdded(stored, other); kept[1].Taints[0].TimeAdded != nil {
		t.Error("a new taint took an old taint's TimeAdded")
	}
}

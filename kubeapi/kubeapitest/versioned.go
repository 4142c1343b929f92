package kubeapitest

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// versionedTracker makes the fake clientset behave as the API server does
// with resourceVersions (the plain fake leaves them as given): every
// stored object gets a new one, and an update or patch carrying a
// resourceVersion other than the stored one fails with Conflict.
type versionedTracker struct {
	k8stesting.ObjectTracker
	mu   sync.Mutex
	next int
}

func (v *versionedTracker) stamp(obj runtime.Object) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	v.next++
	m.SetResourceVersion(strconv.Itoa(v.next))
	if m.GetName() == "" && m.GetGenerateName() != "" {
		// As the API server's name generator: a 5-character suffix.
		m.SetName(m.GetGenerateName() + fmt.Sprintf("%05d", v.next))
		m.SetUID(types.UID("uid-" + strconv.Itoa(v.next)))
	}
	return nil
}

// guard checks obj's resourceVersion (set by the patch or update, else the
// stored one) against the stored object, then stamps a new one.
func (v *versionedTracker) guard(gvr schema.GroupVersionResource, obj runtime.Object, ns string) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	cur, err := v.ObjectTracker.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	cm, err := meta.Accessor(cur)
	if err != nil {
		return err
	}
	if rv := m.GetResourceVersion(); rv != "" && rv != cm.GetResourceVersion() {
		return apierrors.NewConflict(gvr.GroupResource(), m.GetName(), errors.New("the object has been modified"))
	}
	return v.stamp(obj)
}

func (v *versionedTracker) Add(obj runtime.Object) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.stamp(obj); err != nil {
		return err
	}
	return v.ObjectTracker.Add(obj)
}

func (v *versionedTracker) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.stamp(obj); err != nil {
		return err
	}
	return v.ObjectTracker.Create(gvr, obj, ns, opts...)
}

func (v *versionedTracker) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.guard(gvr, obj, ns); err != nil {
		return err
	}
	return v.ObjectTracker.Update(gvr, obj, ns, opts...)
}

func (v *versionedTracker) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.guard(gvr, obj, ns); err != nil {
		return err
	}
	return v.ObjectTracker.Patch(gvr, obj, ns, opts...)
}

// NewVersioned is a fake clientset holding objs whose writes version
// objects as the API server does (see versionedTracker).
func NewVersioned(t testing.TB, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	c := fake.NewClientset()
	vt := &versionedTracker{ObjectTracker: c.Tracker()}
	for _, o := range objs {
		if err := vt.Add(o.DeepCopyObject()); err != nil {
			t.Fatal(err)
		}
	}
	c.PrependReactor("*", "*", k8stesting.ObjectReaction(vt))
	trackers.Store(c, vt)
	return c
}

// trackers maps each NewVersioned clientset to its versionedTracker.
var trackers sync.Map

// VersionedTracker is the tracker behind a NewVersioned clientset: writes
// through it bypass the clientset's reactors (safe inside a reactor,
// where calling the clientset would deadlock) but are versioned all the
// same. It panics for a clientset NewVersioned did not make.
func VersionedTracker(c *fake.Clientset) k8stesting.ObjectTracker {
	vt, ok := trackers.Load(c)
	if !ok {
		panic("kubeapitest: VersionedTracker of a clientset NewVersioned did not make")
	}
	return vt.(*versionedTracker)
}

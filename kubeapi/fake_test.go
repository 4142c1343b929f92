package kubeapi

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi/kubeapitest"
)

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newFake is a fake clientset holding objs whose writes version objects
// as the API server does (kubeapitest.NewVersioned).
func newFake(t testing.TB, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	return kubeapitest.NewVersioned(t, objs...)
}

// fakeClients pairs c with a metadata client listing c's Nodes as they
// are now (the safeguard's fleet count).
func fakeClients(t testing.TB, c *fake.Clientset) Clients {
	t.Helper()
	l, err := c.Tracker().List(schema.GroupVersionResource{Version: "v1", Resource: "nodes"},
		schema.GroupVersionKind{Version: "v1", Kind: "Node"}, "")
	if err != nil {
		t.Fatal(err)
	}
	var metas []runtime.Object
	for _, n := range l.(*corev1.NodeList).Items {
		metas = append(metas, &metav1.PartialObjectMetadata{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}, ObjectMeta: n.ObjectMeta})
	}
	scheme := metadatafake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return Clients{Core: c, Meta: metadatafake.NewSimpleMetadataClient(scheme, metas...)}
}

// modifyNode changes the Node as another client would (read, change,
// update guarded by resourceVersion), retrying on Conflict.
func modifyNode(t testing.TB, c *fake.Clientset, change func(*corev1.Node)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		n, err := c.CoreV1().Nodes().Get(context.Background(), nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(n)
		_, err = c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// updateNode writes n as another client would, through c's tracker: safe
// inside a reactor, where calling the clientset would deadlock.
func updateNode(t testing.TB, c *fake.Clientset, n *corev1.Node) {
	t.Helper()
	if err := kubeapitest.VersionedTracker(c).Update(corev1.SchemeGroupVersion.WithResource("nodes"), n, ""); err != nil {
		t.Error(err)
	}
}

// startWatch runs a NodeWatch of nodeName on c until the test ends and
// waits for its cache to sync.
func startWatch(t testing.TB, c kubernetes.Interface, resync time.Duration) *NodeWatch {
	t.Helper()
	w, err := NewNodeWatch(c, nodeName, resync)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if err := w.WaitSynced(sctx); err != nil {
		t.Fatal(err)
	}
	return w
}

// requests are the actions other than the informer's list and watch
// (those of nodes with a field selector).
func requests(c *fake.Clientset) []k8stesting.Action {
	var out []k8stesting.Action
	for _, a := range c.Actions() {
		if !informerAction(a) {
			out = append(out, a)
		}
	}
	return out
}

func informerAction(a k8stesting.Action) bool {
	if a.GetResource().Resource != "nodes" {
		return false
	}
	switch a := a.(type) {
	case k8stesting.ListAction:
		return !a.GetListRestrictions().Fields.Empty()
	case k8stesting.WatchAction:
		return !a.GetWatchRestrictions().Fields.Empty()
	}
	return false
}

func countVerb(c *fake.Clientset, verb string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == verb {
			n++
		}
	}
	return n
}

// fakeHealth is a Health whose fitness the test sets.
type fakeHealth struct {
	mu sync.Mutex
	f  health.Fitness
	ch chan struct{}
}

func newFakeHealth(f health.Fitness) *fakeHealth {
	return &fakeHealth{f: f, ch: make(chan struct{}, 1)}
}

func (h *fakeHealth) Fitness() health.Fitness {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.f
}

func (h *fakeHealth) Subscribe() <-chan struct{} { return h.ch }

func (h *fakeHealth) set(f health.Fitness) {
	h.mu.Lock()
	h.f = f
	h.mu.Unlock()
	select {
	case h.ch <- struct{}{}:
	default:
	}
}

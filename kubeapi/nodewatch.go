package kubeapi

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// seenVersions is how many recent resourceVersions a NodeWatch remembers,
// so a writer can tell that the informer delivered its write even when
// later writes followed it.
const seenVersions = 32

// NodeWatch follows one Node object with a shared informer scoped to it by
// a field selector on its name: one initial LIST (or watch-list) and one
// WATCH, re-opened when the server ends it; never a watch of all Nodes.
// Its resync re-delivers the cached object (no request) so that consumers
// repair drift. The tainter and the labeler share one NodeWatch, read the
// Node from its cache and are woken by its events.
type NodeWatch struct {
	name     string
	informer cache.SharedIndexInformer
	lister   corelisters.NodeLister

	mu   sync.Mutex
	subs []chan struct{}
	// seen is a ring of the resourceVersions delivered last.
	seen []string
	next int
	// bump is closed, and replaced, on every delivered event.
	bump chan struct{}
}

// NewNodeWatch builds the informer of node nodeName; nothing is requested
// until Run. resync is how often the cached Node is re-delivered to
// subscribers (0: never).
//
// It is client-go's Node informer from an informer factory of its own,
// narrowed by a field selector on the node's name (the factory's list
// options tweak), so the agent lists and watches one Node, never the
// fleet's.
func NewNodeWatch(client kubernetes.Interface, nodeName string, resync time.Duration) (*NodeWatch, error) {
	selector := fields.OneTermEqualSelector("metadata.name", nodeName).String()
	factory := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	nodes := factory.Core().V1().Nodes()
	informer := nodes.Informer()
	w := &NodeWatch{
		name: nodeName, informer: informer, lister: nodes.Lister(),
		seen: make([]string, seenVersions), bump: make(chan struct{}),
	}
	_, err := w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.delivered(obj) },
		UpdateFunc: func(_, obj any) { w.delivered(obj) },
		DeleteFunc: func(obj any) { w.delivered(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("node %s informer: %w", nodeName, err)
	}
	return w, nil
}

// Name is the followed node's name.
func (w *NodeWatch) Name() string { return w.name }

// Run runs the informer until ctx ends and its goroutines have stopped.
func (w *NodeWatch) Run(ctx context.Context) {
	w.informer.RunWithContext(ctx)
}

// WaitSynced waits until the informer's first list has been delivered.
func (w *NodeWatch) WaitSynced(ctx context.Context) error {
	if w.informer.HasSynced() {
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced) {
		return fmt.Errorf("node %s informer not synced: %w", w.name, context.Cause(ctx))
	}
	return nil
}

// Node returns a copy of the cached Node (callers may change it). A node
// that does not exist is an error for which apierrors.IsNotFound holds.
func (w *NodeWatch) Node() (*corev1.Node, error) {
	n, err := w.lister.Get(w.name)
	if err != nil {
		return nil, fmt.Errorf("node %s from the informer cache: %w", w.name, err)
	}
	return n.DeepCopy(), nil
}

// Subscribe returns a channel signalled (coalesced, never blocking the
// informer) on every add, update, delete and resync of the Node.
func (w *NodeWatch) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.subs = append(w.subs, ch)
	w.mu.Unlock()
	return ch
}

// delivered records one event (the store is already updated when the
// handler runs) and signals every subscriber.
func (w *NodeWatch) delivered(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if n, ok := obj.(*corev1.Node); ok && n.ResourceVersion != "" {
		w.seen[w.next] = n.ResourceVersion
		w.next = (w.next + 1) % len(w.seen)
	}
	close(w.bump)
	w.bump = make(chan struct{})
	for _, ch := range w.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// cachedVersion is the cached Node's resourceVersion, "" if absent.
func (w *NodeWatch) cachedVersion() string {
	n, err := w.lister.Get(w.name)
	if err != nil {
		return ""
	}
	return n.ResourceVersion
}

// waitUntil waits, at most timeout, until cond holds; cond is evaluated
// under w.mu after every event.
func (w *NodeWatch) waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		ok, bump := cond(), w.bump
		w.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		case <-bump:
		}
	}
}

// WaitSeen waits, at most timeout, until the informer has delivered the
// Node at resourceVersion rv (a write of ours), and says whether it has.
// Versions are compared for equality only: they are opaque.
func (w *NodeWatch) WaitSeen(ctx context.Context, rv string, timeout time.Duration) bool {
	return w.waitUntil(ctx, timeout, func() bool {
		return slices.Contains(w.seen, rv) || w.cachedVersion() == rv
	})
}

// WaitPast waits, at most timeout, until the cached Node is no longer at
// resourceVersion rv (after a Conflict: the newer version is on its way),
// and says whether it moved on.
func (w *NodeWatch) WaitPast(ctx context.Context, rv string, timeout time.Duration) bool {
	return w.waitUntil(ctx, timeout, func() bool { return w.cachedVersion() != rv })
}

// nodeReader reads the Node for one writer: from the informer's cache,
// unless the cache failed to catch up with the writer's last write or
// conflict, in which case the next read is one GET.
type nodeReader struct {
	watch  *NodeWatch
	client kubernetes.Interface
	log    *slog.Logger
	// catchUp bounds the wait for the informer to deliver a write.
	catchUp time.Duration
	// stale makes the next read a GET.
	stale bool
}

func newNodeReader(w *NodeWatch, client kubernetes.Interface, log *slog.Logger) *nodeReader {
	return &nodeReader{watch: w, client: client, log: log, catchUp: 2 * time.Second}
}

// read returns the Node to compare with what is wanted.
func (r *nodeReader) read(ctx context.Context) (*corev1.Node, error) {
	if !r.stale {
		if err := r.watch.WaitSynced(ctx); err != nil {
			return nil, err
		}
		return r.watch.Node()
	}
	n, err := r.client.CoreV1().Nodes().Get(ctx, r.watch.name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", r.watch.name, err)
	}
	r.stale = false
	return n, nil
}

// wrote waits for the informer to deliver n, the API server's answer to a
// write, so that the next read sees it; if it does not in time, the next
// read is a GET.
func (r *nodeReader) wrote(ctx context.Context, n *corev1.Node) {
	if n == nil || n.ResourceVersion == "" {
		return
	}
	if !r.watch.WaitSeen(ctx, n.ResourceVersion, r.catchUp) && ctx.Err() == nil {
		r.log.Debug("node informer did not deliver our write in time; reading the node once", "node", r.watch.name,
			"resourceVersion", n.ResourceVersion, "wait", r.catchUp)
		r.stale = true
	}
}

// conflicted handles a Conflict on a write guarded by resourceVersion rv:
// it waits for the informer to move past rv, or makes the next read a GET.
func (r *nodeReader) conflicted(ctx context.Context, rv string) {
	if !r.watch.WaitPast(ctx, rv, r.catchUp) && ctx.Err() == nil {
		r.stale = true
	}
}

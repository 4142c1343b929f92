package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// OwnedLabelsAnnotation lists, comma-separated, the label keys the agent
// set on the node. It lets a restarted agent remove labels that its
// previous run set and that no longer apply, without touching labels other
// controllers own.
const OwnedLabelsAnnotation = "gpu-node-agent.io/owned-labels"

// AnnotationKeys returns every Node annotation key the labeler owns (a
// fresh slice): those topology.Annotations can return and
// MoveAdviceAnnotation. OwnedLabelsAnnotation is the labeler's own
// bookkeeping, not among them.
func AnnotationKeys() []string {
	return append(topology.AnnotationKeys(), MoveAdviceAnnotation)
}

// Labeler keeps the agent's topology labels and annotations
// (topology.Labels, topology.Annotations) and its move advice
// (MoveAdviceAnnotation) on one Node object. It compares with the Node in
// the NodeWatch's cache, writes only when what it owns differs, removes
// what it owns and no longer wants, and never touches any other label or
// annotation.
type Labeler struct {
	client kubernetes.Interface
	watch  *NodeWatch
	log    *slog.Logger
	// backoff spaces the retries of one patch.
	backoff wait.Backoff
	// retryBackoff spaces Run's retries of failed Applies.
	retryBackoff wait.Backoff

	mu     sync.Mutex
	reader *nodeReader
}

// NewLabeler returns the labeler of the node watch follows.
func NewLabeler(client kubernetes.Interface, watch *NodeWatch, log *slog.Logger) *Labeler {
	return &Labeler{
		client: client, watch: watch, log: log, reader: newNodeReader(watch, client, log),
		backoff:      wait.Backoff{Steps: 5, Duration: 200 * time.Millisecond, Factor: 2, Jitter: 1},
		retryBackoff: RetryBackoff(),
	}
}

// Run applies want() at start, on every signal of changed (new topology),
// on every event of the node informer (a change of the Node, or its
// resync: a cache read, no request) and, after a failure, with jittered
// exponential backoff, until ctx ends. want returns ok false while there
// is nothing to apply yet.
func (l *Labeler) Run(ctx context.Context, changed <-chan struct{}, want func() (labels, annotations map[string]string, ok bool)) {
	l.run(ctx, changed, func() (nodeMeta, bool) {
		labels, annotations, ok := want()
		return nodeMeta{labels: labels, ownLabels: true, annotations: annotations, keys: AnnotationKeys()}, ok
	})
}

// nodeMeta is what one apply makes true on the Node: the labels (when
// ownLabels) and the annotations with keys, each absent from annotations
// removed. What it does not own (the labels without ownLabels, the other
// annotation keys) is left as it is: the node object applies the
// topology's part only from complete discoveries and the move advice's
// only once it is known, each without holding up the other.
type nodeMeta struct {
	labels      map[string]string
	ownLabels   bool
	annotations map[string]string
	keys        []string
}

// run is Run with the scope of each apply chosen by want.
func (l *Labeler) run(ctx context.Context, changed <-chan struct{}, want func() (nodeMeta, bool)) {
	reconcileLoop(ctx, l.retryBackoff, func(ctx context.Context) error {
		if m, ok := want(); ok {
			return l.apply(ctx, m)
		}
		return nil
	}, func(err error, retry time.Duration) {
		l.log.Warn("node labels and annotations not updated; retrying", "node", l.watch.Name(), "err", err, "retry", retry)
	}, changed, l.watch.Subscribe())
}

// Apply makes the labels and annotations the agent owns on the node equal
// to labels and annotations: it adds and updates those, and removes the
// ones it set before that are no longer wanted. Owned labels are the ones
// listed in OwnedLabelsAnnotation; owned annotations are the fixed keys
// AnnotationKeys returns (any other key in annotations is refused), so
// restarts need no bookkeeping for them. Nothing is sent when the cached
// Node is already as wanted; otherwise one JSON merge patch carries every
// change (no read-modify-write race with other writers), retried with
// jittered backoff on conflicts and transient API errors.
func (l *Labeler) Apply(ctx context.Context, labels, annotations map[string]string) error {
	return l.apply(ctx, nodeMeta{labels: labels, ownLabels: true, annotations: annotations, keys: AnnotationKeys()})
}

// apply is Apply on m's scope: labels only when m.ownLabels, annotations
// only of m.keys (each one the labeler owns).
func (l *Labeler) apply(ctx context.Context, m nodeMeta) error {
	all := AnnotationKeys()
	for _, k := range m.keys {
		if !slices.Contains(all, k) {
			return fmt.Errorf("node %s: annotation %s is not one the agent owns", l.watch.Name(), k)
		}
	}
	for k := range m.annotations {
		if !slices.Contains(m.keys, k) {
			return fmt.Errorf("node %s: annotation %s is not one the agent owns", l.watch.Name(), k)
		}
	}
	labels := m.labels
	if !m.ownLabels {
		labels = nil
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	node, err := l.reader.read(ctx)
	if err != nil {
		return err
	}
	haveLabels, haveAnnotations := owned(node, m.keys)
	if !m.ownLabels {
		haveLabels = nil
	}
	annotations := m.annotations
	if maps.Equal(haveLabels, labels) && maps.Equal(haveAnnotations, annotations) {
		return nil
	}

	patchLabels, removedLabels := mergePatch(haveLabels, labels)
	patchAnnotations, removedAnnotations := mergePatch(haveAnnotations, annotations)
	var setAnnotations []string
	for k, v := range patchAnnotations {
		if v != nil {
			setAnnotations = append(setAnnotations, k)
		}
	}
	slices.Sort(setAnnotations)
	if len(patchLabels) > 0 {
		patchAnnotations[OwnedLabelsAnnotation] = strings.Join(slices.Sorted(maps.Keys(labels)), ",")
	}
	meta := map[string]any{}
	if len(patchLabels) > 0 {
		meta["labels"] = patchLabels
	}
	if len(patchAnnotations) > 0 {
		meta["annotations"] = patchAnnotations
	}
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return fmt.Errorf("node %s patch: %w", l.watch.Name(), err)
	}
	var patched *corev1.Node
	err = retry.OnError(l.backoff, retriable, func() error {
		var err error
		patched, err = l.client.CoreV1().Nodes().Patch(ctx, l.watch.Name(), types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("patch node %s labels and annotations: %w", l.watch.Name(), err)
	}
	level := slog.LevelInfo
	if _, advice := patchAnnotations[MoveAdviceAnnotation]; advice && len(patchAnnotations) == 1 && len(patchLabels) == 0 {
		// The move advice follows the node's pods: one line per change
		// at info would be noise.
		level = slog.LevelDebug
	}
	l.log.Log(ctx, level, "node labels and annotations updated", "node", l.watch.Name(),
		"labelsSet", len(patchLabels)-len(removedLabels), "labelsRemoved", removedLabels,
		"annotationsSet", setAnnotations, "annotationsRemoved", removedAnnotations)
	l.reader.wrote(ctx, patched)
	return nil
}

// owned is what the agent owns on node: the labels listed in
// OwnedLabelsAnnotation (an owned label someone removed reads as "\x00",
// which no wanted value equals) and the annotations with keys.
func owned(node *corev1.Node, keys []string) (labels, annotations map[string]string) {
	labels = map[string]string{}
	for _, k := range splitOwned(node.Annotations[OwnedLabelsAnnotation]) {
		if v, ok := node.Labels[k]; ok {
			labels[k] = v
		} else {
			labels[k] = "\x00" // owned but absent: still in the annotation
		}
	}
	annotations = map[string]string{}
	for _, k := range keys {
		if v, ok := node.Annotations[k]; ok {
			annotations[k] = v
		}
	}
	return labels, annotations
}

// mergePatch returns the merge-patch entries that turn have into want
// (null for a key to remove) and the removed keys, sorted.
func mergePatch(have, want map[string]string) (map[string]any, []string) {
	patch := map[string]any{}
	for k, v := range want {
		if old, ok := have[k]; !ok || old != v {
			patch[k] = v
		}
	}
	var removed []string
	for k := range have {
		if _, ok := want[k]; !ok {
			patch[k] = nil
			removed = append(removed, k)
		}
	}
	slices.Sort(removed)
	return patch, removed
}

// retriable says whether an API error is worth another try.
func retriable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

func splitOwned(s string) []string {
	var out []string
	for _, k := range strings.Split(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			out = append(out, k)
		}
	}
	return out
}

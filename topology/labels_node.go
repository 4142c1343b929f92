package topology

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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// OwnedLabelsAnnotation lists, comma-separated, the label keys the agent
// set on the node. It lets a restarted agent remove labels that its
// previous run set and that no longer apply, without touching labels other
// controllers own.
const OwnedLabelsAnnotation = "gpu-node-agent.io/owned-labels"

// NodeLabeler keeps the agent's labels and annotations on one Node object.
// It only writes when what it owns changes, removes what it owns and no
// longer wants, and never touches any other label or annotation.
type NodeLabeler struct {
	client   kubernetes.Interface
	nodeName string
	log      *slog.Logger
	backoff  wait.Backoff

	mu sync.Mutex
	// read is set once the node has been read: labels and annotations
	// then hold what the node carries from us, as of the last successful
	// Apply.
	read        bool
	labels      map[string]string
	annotations map[string]string
}

// NewNodeLabeler returns a labeler for the node named nodeName.
func NewNodeLabeler(client kubernetes.Interface, nodeName string, log *slog.Logger) *NodeLabeler {
	return &NodeLabeler{
		client:   client,
		nodeName: nodeName,
		log:      log,
		backoff:  wait.Backoff{Steps: 5, Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1},
	}
}

// Apply makes the labels and annotations the agent owns on the node equal
// to labels and annotations: it adds and updates those, and removes the
// ones it set before that are no longer wanted. Owned labels are the ones
// listed in OwnedLabelsAnnotation; owned annotations are the fixed keys
// Annotations can return (any other key in annotations is refused), so
// restarts need no bookkeeping for them. Nothing is sent when the node is
// already as wanted; otherwise one JSON merge patch carries every change
// (no read-modify-write race with other writers), retried with backoff on
// conflicts and transient API errors.
func (l *NodeLabeler) Apply(ctx context.Context, labels, annotations map[string]string) error {
	for k := range annotations {
		if !slices.Contains(annotationKeys, k) {
			return fmt.Errorf("node %s: annotation %s is not one the agent owns", l.nodeName, k)
		}
	}

	l.mu.Lock()
	defer l.mu.Unlock()

	if !l.read {
		if err := l.learn(ctx); err != nil {
			return err
		}
	}
	if maps.Equal(l.labels, labels) && maps.Equal(l.annotations, annotations) {
		return nil
	}

	patchLabels, removedLabels := mergePatch(l.labels, labels)
	patchAnnotations, removedAnnotations := mergePatch(l.annotations, annotations)
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
		return fmt.Errorf("node %s patch: %w", l.nodeName, err)
	}
	err = retry.OnError(l.backoff, retriable, func() error {
		_, err := l.client.CoreV1().Nodes().Patch(ctx, l.nodeName, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("patch node %s labels and annotations: %w", l.nodeName, err)
	}
	l.log.Info("node labels and annotations updated", "node", l.nodeName,
		"labelsSet", len(patchLabels)-len(removedLabels), "labelsRemoved", removedLabels,
		"annotationsSet", setAnnotations, "annotationsRemoved", removedAnnotations)
	l.labels = maps.Clone(labels)
	l.annotations = maps.Clone(annotations)
	return nil
}

// learn reads what a previous run left on the node: the labels listed in
// OwnedLabelsAnnotation and the annotations the agent owns.
func (l *NodeLabeler) learn(ctx context.Context) error {
	var nodeLabels, nodeAnnotations map[string]string
	err := retry.OnError(l.backoff, retriable, func() error {
		n, err := l.client.CoreV1().Nodes().Get(ctx, l.nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		nodeLabels, nodeAnnotations = n.Labels, n.Annotations
		return nil
	})
	if err != nil {
		return fmt.Errorf("read node %s: %w", l.nodeName, err)
	}
	l.labels = map[string]string{}
	for _, k := range splitOwned(nodeAnnotations[OwnedLabelsAnnotation]) {
		if v, ok := nodeLabels[k]; ok {
			l.labels[k] = v
		} else {
			l.labels[k] = "\x00" // owned but absent: still in the annotation
		}
	}
	l.annotations = map[string]string{}
	for _, k := range annotationKeys {
		if v, ok := nodeAnnotations[k]; ok {
			l.annotations[k] = v
		}
	}
	l.read = true
	return nil
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

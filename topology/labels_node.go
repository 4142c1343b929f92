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

// NodeLabeler keeps the agent's labels on one Node object. It only writes
// when the labels it owns change, removes owned labels that disappear and
// never touches any other label.
type NodeLabeler struct {
	client   kubernetes.Interface
	nodeName string
	log      *slog.Logger
	backoff  wait.Backoff

	mu sync.Mutex
	// applied is what the node carries from us, as of the last successful
	// Apply; nil until the node has been read once.
	applied map[string]string
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

// Apply makes the labels the agent owns on the node equal to labels: it
// adds and updates those, and removes the ones it set before that are no
// longer in labels. Nothing is sent when that is already the case. Writes
// are JSON merge patches (no read-modify-write race with other writers),
// retried with backoff on conflicts and transient API errors.
func (l *NodeLabeler) Apply(ctx context.Context, labels map[string]string) error {
	l.mu.Lock()
	defer l.mu.Unlock()

	if l.applied == nil {
		// First call: learn what a previous run left on the node.
		var node map[string]string
		var owned []string
		err := retry.OnError(l.backoff, retriable, func() error {
			n, err := l.client.CoreV1().Nodes().Get(ctx, l.nodeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			node = n.Labels
			owned = splitOwned(n.Annotations[OwnedLabelsAnnotation])
			return nil
		})
		if err != nil {
			return fmt.Errorf("read node %s labels: %w", l.nodeName, err)
		}
		l.applied = map[string]string{}
		for _, k := range owned {
			if v, ok := node[k]; ok {
				l.applied[k] = v
			} else {
				l.applied[k] = "\x00" // owned but absent: still in the annotation
			}
		}
	}
	if maps.Equal(l.applied, labels) {
		return nil
	}

	patchLabels := map[string]any{}
	for k, v := range labels {
		if old, ok := l.applied[k]; !ok || old != v {
			patchLabels[k] = v
		}
	}
	var removed []string
	for k := range l.applied {
		if _, ok := labels[k]; !ok {
			patchLabels[k] = nil
			removed = append(removed, k)
		}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"labels":      patchLabels,
			"annotations": map[string]any{OwnedLabelsAnnotation: strings.Join(slices.Sorted(maps.Keys(labels)), ",")},
		},
	})
	if err != nil {
		return fmt.Errorf("node %s label patch: %w", l.nodeName, err)
	}
	err = retry.OnError(l.backoff, retriable, func() error {
		_, err := l.client.CoreV1().Nodes().Patch(ctx, l.nodeName, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("patch node %s labels: %w", l.nodeName, err)
	}
	slices.Sort(removed)
	l.log.Info("node labels updated", "node", l.nodeName, "set", len(patchLabels)-len(removed), "removed", removed)
	l.applied = maps.Clone(labels)
	return nil
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

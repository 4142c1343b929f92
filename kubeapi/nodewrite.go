package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// MaxMessage bounds condition and event messages (the API server rejects
// event messages over 1 KiB).
const MaxMessage = 1024

// newWritesCounter is gpu_node_agent_kube_api_writes_total, which every
// nodeWriter of one agent shares (the health tainter's and the preflight
// gate's): its kinds are what was written, not who wrote it.
func newWritesCounter() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_node_agent_kube_api_writes_total",
		Help: "Writes the agent made to its Node and the Node's Events (health taint and condition, preflight taint and condition, clear-faults and preflight-rerun annotations), by kind (taint, condition, event, annotation).",
	}, []string{"kind"})
}

// nodeWriter makes one part's writes to what it owns on the Node: the
// taints with its key (the whole list in one merge patch guarded by the
// resourceVersion compared with, so another writer's taints are never
// lost), its condition (a strategic merge patch of status.conditions,
// which the API server merges by type), and Events about the node. Each
// write is counted; in dry-run mode it is logged instead. The tainter
// and the preflight gate each have one; use it from one goroutine.
type nodeWriter struct {
	client         kubernetes.Interface
	node           string
	eventNamespace string
	// controller is the Events' reportingController.
	controller string
	dryRunMode bool
	writes     *prometheus.CounterVec
	log        *slog.Logger
	// lastDryRun is the last dry-run write logged, by what: each is
	// logged once until it changes.
	lastDryRun map[string]string
}

func newNodeWriter(client kubernetes.Interface, node, eventNamespace, controller string, dryRun bool, writes *prometheus.CounterVec, log *slog.Logger) *nodeWriter {
	return &nodeWriter{client: client, node: node, eventNamespace: eventNamespace, controller: controller,
		dryRunMode: dryRun, writes: writes, log: log, lastDryRun: map[string]string{}}
}

// syncTaints makes the Node's taints with key what desired returns for
// the Node read through r, retrying a write refused with Conflict on the
// newer Node (the informer's, or one GET if it lags). desired may write to
// the Node itself, returning the Node it wrote (else nil), and returns ok
// false to leave the taints as they are. syncTaints returns the Node last
// read or written, and the API server's answer to the last write, for
// r.wrote (nil when nothing was written).
func (w *nodeWriter) syncTaints(ctx context.Context, r *nodeReader, key string,
	desired func(node *corev1.Node) (wrote *corev1.Node, want []corev1.Taint, ok bool, err error)) (node, written *corev1.Node, err error) {
	err = retry.OnError(conflictBackoff(), apierrors.IsConflict, func() error {
		var err error
		if node, err = r.read(ctx); err != nil {
			return err
		}
		patched, want, ok, err := desired(node)
		if patched != nil {
			node, written = patched, patched
		}
		if err != nil || !ok || sameTaints(node.Spec.Taints, want) {
			return err
		}
		patched, err = w.patchTaints(ctx, node, key, want)
		if apierrors.IsConflict(err) {
			r.conflicted(ctx, node.ResourceVersion)
		}
		if err != nil {
			return err
		}
		if patched != nil {
			node, written = patched, patched
		}
		return nil
	})
	return node, written, err
}

// withTaints is existing with the taints of key replaced by add.
func withTaints(existing []corev1.Taint, key string, add ...corev1.Taint) []corev1.Taint {
	var out []corev1.Taint
	for _, x := range existing {
		if x.Key != key {
			out = append(out, x)
		}
	}
	return append(out, add...)
}

// hasTaint says whether taints hold one with key.
func hasTaint(taints []corev1.Taint, key string) bool {
	return slices.ContainsFunc(taints, func(x corev1.Taint) bool { return x.Key == key })
}

// taintsWithKey are the taints with key.
func taintsWithKey(taints []corev1.Taint, key string) []corev1.Taint {
	var out []corev1.Taint
	for _, x := range taints {
		if x.Key == key {
			out = append(out, x)
		}
	}
	return out
}

// sameTaints compares taints as sets by key, value and effect.
func sameTaints(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.ContainsFunc(b, func(y corev1.Taint) bool {
			return x.Key == y.Key && x.Value == y.Value && x.Effect == y.Effect
		}) {
			return false
		}
	}
	return true
}

// taintStrings are taints as kubectl writes them (key=value:effect).
func taintStrings(taints []corev1.Taint) []string {
	out := make([]string, 0, len(taints))
	for _, x := range taints {
		out = append(out, x.ToString())
	}
	return out
}

// patchTaints replaces the taint list with want, guarded by the
// resourceVersion of the Node compared with: a concurrent writer makes it
// fail with Conflict, so taints others added meanwhile are never lost. It
// returns the patched Node (nil in dry-run mode). key is the writer's
// taint key, for the log.
func (w *nodeWriter) patchTaints(ctx context.Context, node *corev1.Node, key string, want []corev1.Taint) (*corev1.Node, error) {
	if want == nil {
		want = []corev1.Taint{}
	}
	if w.dryRun("taints", strings.Join(taintStrings(want), ",")) {
		return nil, nil
	}
	body, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": want},
	})
	if err != nil {
		return nil, fmt.Errorf("encode taint patch: %w", err)
	}
	patched, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patch taints of node %s: %w", w.node, err)
	}
	w.writes.WithLabelValues("taint").Inc()
	w.log.Info("node taints updated", "node", w.node, "taints", len(want), "ours", taintStrings(taintsWithKey(want, key)))
	return patched, nil
}

// removeAnnotation removes the Node's annotation key with a JSON patch
// that first tests it still holds value, so a newer value written
// meanwhile is neither lost nor removed unseen (the patch fails with
// Invalid or Conflict, and the caller's next reconcile reads it). It
// returns the patched Node.
func (w *nodeWriter) removeAnnotation(ctx context.Context, key, value string) (*corev1.Node, error) {
	path := "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
	body, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": value},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return nil, fmt.Errorf("encode annotation %s patch: %w", key, err)
	}
	patched, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.JSONPatchType, body, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("remove annotation %s from node %s: %w", key, w.node, err)
	}
	w.writes.WithLabelValues("annotation").Inc()
	return patched, nil
}

// findCondition is node's condition of type typ, nil if it has none.
func findCondition(node *corev1.Node, typ string) *corev1.NodeCondition {
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeConditionType(typ) {
			return &node.Status.Conditions[i]
		}
	}
	return nil
}

// setCondition gives node's condition typ the status, reason and message
// (truncated to MaxMessage) if any of them differ, keeping its transition
// time while the status stays, or if its transition predates boot (zero:
// never), which then becomes now. It returns the patched Node and true when
// it wrote (nil and false when the condition was as wanted, or in dry-run
// mode).
func (w *nodeWriter) setCondition(ctx context.Context, node *corev1.Node, typ string, status corev1.ConditionStatus, reason, msg string, boot time.Time) (*corev1.Node, bool, error) {
	msg = truncate(msg)
	old := findCondition(node, typ)
	// A state that dates from before boot is not the state since boot,
	// even when it reads the same: it is written anew.
	stale := old != nil && passedBeforeBoot(old, boot)
	if old != nil && old.Status == status && old.Reason == reason && old.Message == msg && !stale {
		return nil, false, nil
	}
	now := metav1.Now()
	transition := now
	if old != nil && old.Status == status && !stale {
		transition = old.LastTransitionTime
	}
	cond := corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: status, Reason: reason, Message: msg,
		LastHeartbeatTime: now, LastTransitionTime: transition}
	if w.dryRun("condition", fmt.Sprintf("%s=%s %s: %s", typ, status, reason, msg)) {
		return nil, false, nil
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return nil, false, fmt.Errorf("encode condition patch: %w", err)
	}
	patched, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		return nil, false, fmt.Errorf("patch condition %s of node %s: %w", typ, w.node, err)
	}
	w.writes.WithLabelValues("condition").Inc()
	w.log.Info("node condition updated", "node", w.node, "condition", typ, "status", status, "reason", reason, "message", msg)
	return patched, true, nil
}

// event posts a Node event where the kubelet posts its own. Failing to
// post one is logged, not retried: the condition carries the state.
func (w *nodeWriter) event(ctx context.Context, node *corev1.Node, typ, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		// Named like the kubelet's events (<object>.<hex time>) rather
		// than generateName, so the name is known before the create.
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", w.node, now.UnixNano()), Namespace: w.eventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: w.node, UID: node.UID,
			ResourceVersion: node.ResourceVersion},
		Reason: reason, Message: truncate(msg), Type: typ,
		Source:         corev1.EventSource{Component: "gpu-node-agent", Host: w.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: w.controller, ReportingInstance: w.node,
	}
	if w.dryRun("event", reason+": "+msg) {
		return
	}
	if _, err := w.client.CoreV1().Events(w.eventNamespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		w.log.Warn("posting node event failed", "node", w.node, "reason", reason, "err", err)
		return
	}
	w.writes.WithLabelValues("event").Inc()
}

// dryRun logs the write that would be made (once until it changes) and
// reports whether to skip it.
func (w *nodeWriter) dryRun(what, value string) bool {
	if !w.dryRunMode {
		return false
	}
	if w.lastDryRun[what] != value {
		w.log.Info("dry-run: would update node", "node", w.node, "what", what, "value", value)
		w.lastDryRun[what] = value
	}
	return true
}

func truncate(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	return s[:MaxMessage-3] + "..."
}

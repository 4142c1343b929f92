package health

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// ClearFaultsAnnotation is the Node annotation an operator sets to clear
// held faults after fixing a GPU: a GPU or MIG UUID, or "all". The tainter
// acts on it once (Monitor.ClearFaults), removes it and posts an Event.
const ClearFaultsAnnotation = "gpu-node-agent.io/clear-faults"

// FaultClearer clears held faults on an operator's request (Monitor).
type FaultClearer interface {
	ClearFaults(target string) (cleared []string, err error)
}

// maxMessage bounds condition and event messages (the API server rejects
// event messages over 1 KiB).
const maxMessage = 1024

// Tainter mirrors the node's fitness onto its Node object: while unfit, a
// taint (key=reason:effect), condition GPUHealthy=False listing the
// devices, and an Event per transition; when fit again, the taint removed
// and the condition True. It writes only what differs from the Node it
// has just read (zero writes at steady state), never touches other
// taints, and refuses to add its taint when too much of the fleet already
// carries it. Use it from one goroutine: Run, or Reconcile calls in turn.
type Tainter struct {
	client kubernetes.Interface
	node   string
	cfg    TaintConfig
	log    *slog.Logger

	refusedGauge prometheus.Gauge
	writes       *prometheus.CounterVec

	// minBackoff and maxBackoff bound the retry delay while the API
	// server fails.
	minBackoff, maxBackoff time.Duration

	// clearer acts on ClearFaultsAnnotation; Run sets the monitor.
	clearer FaultClearer

	// State of the last reconcile, to log dry-run and refusal once.
	refused    bool
	lastDryRun string
}

// NewTainter builds the tainter of node nodeName. cfg is used with its
// defaults applied; validate it first (TaintConfig.Validate). reg may be
// nil; registering its metrics on reg twice is an error, not a panic.
func NewTainter(client kubernetes.Interface, nodeName string, cfg TaintConfig, log *slog.Logger, reg prometheus.Registerer) (*Tainter, error) {
	t := &Tainter{
		client: client, node: nodeName, cfg: cfg.WithDefaults(), log: log,
		refusedGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_node_agent_taint_refused",
			Help: "1 while the fleet safeguard refuses to taint this unfit node because too many nodes already carry the taint.",
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kube_api_writes_total",
			Help: "Writes the tainter made to the Kubernetes API, by kind (taint, condition, event, annotation).",
		}, []string{"kind"}),
		minBackoff: time.Second,
		maxBackoff: 2 * time.Minute,
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{t.refusedGauge, t.writes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tainter metrics: %w", err)
			}
		}
	}
	return t, nil
}

// Run reconciles the Node with mon's fitness until ctx ends: at start, on
// every change of health, every Resync (a read; writes only on drift), and
// with exponential backoff while the API server fails. With mode off it
// returns at once.
func (t *Tainter) Run(ctx context.Context, mon *Monitor) error {
	if t.cfg.Mode == TaintOff {
		t.log.Info("node tainting is off")
		return nil
	}
	if t.clearer == nil {
		t.clearer = mon
	}
	changes := mon.subscribe()
	resync := time.NewTicker(t.cfg.Resync)
	defer resync.Stop()
	backoff := t.minBackoff
	for {
		var retryC <-chan time.Time
		if err := t.Reconcile(ctx, mon.Fitness()); err != nil && ctx.Err() == nil {
			t.log.Warn("updating node taint/condition failed; retrying", "node", t.node, "err", err, "retry", backoff)
			retryC = time.After(backoff)
			backoff = min(2*backoff, t.maxBackoff)
		} else {
			backoff = t.minBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-resync.C:
		case <-retryC:
		}
	}
}

// SetFaultClearer sets what acts on the clear-faults annotation (Run uses
// its monitor when none is set).
func (t *Tainter) SetFaultClearer(c FaultClearer) { t.clearer = c }

// Reconcile makes the Node reflect f once: taint, condition, events. A
// clear-faults annotation on the Node is acted on first; the fitness it
// changes arrives with the monitor's next change signal.
func (t *Tainter) Reconcile(ctx context.Context, f Fitness) error {
	if t.cfg.Mode == TaintOff {
		return nil
	}
	var node *corev1.Node
	var refused bool
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		var err error
		node, err = t.client.CoreV1().Nodes().Get(ctx, t.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", t.node, err)
		}
		if err := t.clearFaults(ctx, node); err != nil {
			return err
		}
		ours := t.ourTaints(node.Spec.Taints)
		refused = false
		if !f.Fit && len(ours) == 0 {
			ok, err := t.fleetAllows(ctx)
			if err != nil {
				return err
			}
			refused = !ok
		}
		want := t.desiredTaints(node.Spec.Taints, f, refused)
		if sameTaints(node.Spec.Taints, want) {
			return nil
		}
		return t.patchTaints(ctx, node, want)
	})
	if err != nil {
		return err
	}
	t.noteRefusal(ctx, node, f, refused)
	return t.reconcileCondition(ctx, node, f)
}

// ourTaints are the taints with our key.
func (t *Tainter) ourTaints(taints []corev1.Taint) []corev1.Taint {
	var out []corev1.Taint
	for _, x := range taints {
		if x.Key == t.cfg.Key {
			out = append(out, x)
		}
	}
	return out
}

// desiredTaints is existing with our taints replaced by those f calls for.
func (t *Tainter) desiredTaints(existing []corev1.Taint, f Fitness, refused bool) []corev1.Taint {
	var out []corev1.Taint
	for _, x := range existing {
		if x.Key != t.cfg.Key {
			out = append(out, x)
		}
	}
	if f.Fit || refused {
		return out
	}
	value := f.Reason
	if len(validation.IsValidLabelValue(value)) > 0 || value == "" {
		value = "unhealthy"
	}
	effects := []corev1.TaintEffect{corev1.TaintEffect(t.cfg.Effect)}
	if t.cfg.NoExecuteForNodeFaults && f.NodeWide && effects[0] != corev1.TaintEffectNoExecute {
		effects = append(effects, corev1.TaintEffectNoExecute)
	}
	for _, e := range effects {
		taint := corev1.Taint{Key: t.cfg.Key, Value: value, Effect: e}
		if e == corev1.TaintEffectNoExecute {
			// Keep the original time so tolerationSeconds count from
			// the first taint, not from each reason change.
			now := metav1.Now()
			taint.TimeAdded = &now
			for _, old := range existing {
				if old.Key == t.cfg.Key && old.Effect == e && old.TimeAdded != nil {
					taint.TimeAdded = old.TimeAdded
				}
			}
		}
		out = append(out, taint)
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

// patchTaints replaces the taint list, guarded by the resourceVersion just
// read: a concurrent writer makes it fail with Conflict, and Reconcile
// reads again, so taints others added meanwhile are never lost.
func (t *Tainter) patchTaints(ctx context.Context, node *corev1.Node, want []corev1.Taint) error {
	if want == nil {
		want = []corev1.Taint{}
	}
	patch := map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": want},
	}
	if t.dryRun("taints", want) {
		return nil
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return fmt.Errorf("encode taint patch: %w", err)
	}
	if _, err := t.client.CoreV1().Nodes().Patch(ctx, t.node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch taints of node %s: %w", t.node, err)
	}
	t.writes.WithLabelValues("taint").Inc()
	t.log.Info("node taints updated", "node", t.node, "taints", len(want), "ours", len(t.ourTaints(want)))
	return nil
}

// fleetAllows counts the selected nodes already carrying our taint and
// says whether this node may add it. One node may always be tainted, so a
// lone or small cluster still protects itself.
func (t *Tainter) fleetAllows(ctx context.Context) (bool, error) {
	list, err := t.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: t.cfg.NodeSelector, ResourceVersion: "0"})
	if err != nil {
		return false, fmt.Errorf("list nodes %q for the fleet safeguard: %w", t.cfg.NodeSelector, err)
	}
	total, tainted := len(list.Items), 0
	self := false
	for _, n := range list.Items {
		if n.Name == t.node {
			self = true
			continue
		}
		if len(t.ourTaints(n.Spec.Taints)) > 0 {
			tainted++
		}
	}
	if !self {
		total++
	}
	allowed := max(1, int(math.Floor(t.cfg.MaxFraction*float64(total)+1e-9)))
	if tainted+1 > allowed {
		if !t.refused {
			t.log.Warn("fleet safeguard: not tainting this node", "node", t.node, "tainted", tainted, "nodes", total,
				"maxFraction", t.cfg.MaxFraction, "selector", t.cfg.NodeSelector)
		}
		return false, nil
	}
	return true, nil
}

// noteRefusal updates the refusal gauge and posts one event when a
// refusal starts.
func (t *Tainter) noteRefusal(ctx context.Context, node *corev1.Node, f Fitness, refused bool) {
	t.refusedGauge.Set(boolGauge(refused))
	if refused && !t.refused {
		t.event(ctx, node, corev1.EventTypeWarning, "TaintRefused",
			"fleet safeguard: too many nodes already carry "+t.cfg.Key+"; not tainting. "+f.Message)
	}
	t.refused = refused
}

// reconcileCondition sets the condition if its status, reason or message
// differ, and posts an event for the change.
func (t *Tainter) reconcileCondition(ctx context.Context, node *corev1.Node, f Fitness) error {
	status, reason, msg := corev1.ConditionTrue, "AllDevicesHealthy", "all GPUs and devices are healthy"
	evType, evReason := corev1.EventTypeNormal, "GPUHealthy"
	if !f.Fit {
		status, reason, msg = corev1.ConditionFalse, "DevicesUnhealthy", truncate(f.Message)
		if f.NodeWide {
			reason = "NVMLFailure"
		}
		evType, evReason = corev1.EventTypeWarning, "GPUUnhealthy"
	}
	ctype := corev1.NodeConditionType(t.cfg.ConditionType)
	var old *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == ctype {
			old = &node.Status.Conditions[i]
		}
	}
	if old != nil && old.Status == status && old.Reason == reason && old.Message == msg {
		return nil
	}
	if old == nil && f.Fit && t.cfg.Mode == TaintDryRun {
		return nil
	}
	now := metav1.Now()
	transition := now
	if old != nil && old.Status == status {
		transition = old.LastTransitionTime
	}
	cond := corev1.NodeCondition{Type: ctype, Status: status, Reason: reason, Message: msg,
		LastHeartbeatTime: now, LastTransitionTime: transition}
	if t.dryRun("condition", cond) {
		return nil
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return fmt.Errorf("encode condition patch: %w", err)
	}
	if _, err := t.client.CoreV1().Nodes().Patch(ctx, t.node, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("patch condition %s of node %s: %w", ctype, t.node, err)
	}
	t.writes.WithLabelValues("condition").Inc()
	t.log.Info("node condition updated", "node", t.node, "condition", ctype, "status", status, "reason", reason, "message", msg)
	if old == nil && f.Fit {
		return nil // first report of a healthy node is not a transition
	}
	t.event(ctx, node, evType, evReason, msg)
	return nil
}

// event posts a Node event where the kubelet posts its own. Failing to
// post one is logged, not retried: the condition carries the state.
func (t *Tainter) event(ctx context.Context, node *corev1.Node, typ, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		// Named like the kubelet's events (<object>.<hex time>) rather
		// than generateName, so the name is known before the create.
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", t.node, now.UnixNano()), Namespace: t.cfg.EventNamespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: t.node, UID: node.UID,
			ResourceVersion: node.ResourceVersion},
		Reason: reason, Message: truncate(msg), Type: typ,
		Source:         corev1.EventSource{Component: "gpu-node-agent", Host: t.node},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "gpu-node-agent.io/health", ReportingInstance: t.node,
	}
	if t.dryRun("event", reason+": "+msg) {
		return
	}
	if _, err := t.client.CoreV1().Events(t.cfg.EventNamespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.log.Warn("posting node event failed", "node", t.node, "reason", reason, "err", err)
		return
	}
	t.writes.WithLabelValues("event").Inc()
}

// dryRun logs the write that would be made (once per distinct write) and
// reports whether to skip it.
func (t *Tainter) dryRun(what string, v any) bool {
	if t.cfg.Mode != TaintDryRun {
		return false
	}
	desc := fmt.Sprintf("%s %+v", what, v)
	if desc != t.lastDryRun {
		t.log.Info("dry-run: would update node", "node", t.node, "what", what, "value", fmt.Sprintf("%+v", v))
		t.lastDryRun = desc
	}
	return true
}

func truncate(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return s[:maxMessage-3] + "..."
}

// clearFaults acts on the clear-faults annotation of node, if any: the
// faults are cleared once, then the annotation is removed with a JSON
// patch that first tests it still holds the value acted on, so a newer
// request written meanwhile is neither lost nor removed unseen (the patch
// fails, Reconcile reads again and acts on the new value). The result is
// posted as an Event. In dry-run mode nothing is cleared or written.
func (t *Tainter) clearFaults(ctx context.Context, node *corev1.Node) error {
	target, ok := node.Annotations[ClearFaultsAnnotation]
	if !ok || t.clearer == nil {
		return nil
	}
	if t.dryRun("clear-faults", target) {
		return nil
	}
	cleared, cerr := t.clearer.ClearFaults(target)
	path := "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(ClearFaultsAnnotation)
	body, err := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": target},
		{"op": "remove", "path": path},
	})
	if err != nil {
		return fmt.Errorf("encode clear-faults annotation patch: %w", err)
	}
	patched, err := t.client.CoreV1().Nodes().Patch(ctx, t.node, types.JSONPatchType, body, metav1.PatchOptions{})
	if err != nil {
		// Cleared already; clearing again when the patch is retried is
		// harmless (ClearFaults is idempotent).
		return fmt.Errorf("remove annotation %s from node %s: %w", ClearFaultsAnnotation, t.node, err)
	}
	t.writes.WithLabelValues("annotation").Inc()
	*node = *patched
	if cerr != nil {
		t.log.Warn("clear-faults request rejected", "node", t.node, "target", target, "err", cerr)
		t.event(ctx, node, corev1.EventTypeWarning, "ClearFaultsRejected", cerr.Error())
		return nil
	}
	msg := "operator cleared faults of " + target + ": "
	if len(cleared) == 0 {
		msg += "no held or recovering fault to clear"
	} else {
		msg += strings.Join(cleared, ", ")
	}
	t.log.Info("clear-faults request done", "node", t.node, "target", target, "cleared", cleared)
	t.event(ctx, node, corev1.EventTypeNormal, "FaultsCleared", msg)
	return nil
}

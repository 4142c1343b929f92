package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/gpu-node-agent/gpu-node-agent/health"
)

// maxMessage bounds condition and event messages (the API server rejects
// event messages over 1 KiB).
const maxMessage = 1024

// Health is what the Tainter mirrors onto the Node: *health.Monitor.
type Health interface {
	// Fitness is the node's fitness now.
	Fitness() health.Fitness
	// Subscribe returns a coalesced signal of every fitness change.
	Subscribe() <-chan struct{}
}

// Tainter mirrors the node's fitness onto its Node object: while unfit, a
// taint (key=reason:effect), condition GPUHealthy=False listing the
// devices, and an Event per transition; when fit again, the taint removed
// and the condition True. It compares with the Node in the NodeWatch's
// cache and writes only what differs (no request at all at steady state),
// never touches other taints, and asks the fleet Safeguard before adding
// its taint. Use it from one goroutine: Run, or Reconcile calls in turn.
type Tainter struct {
	client    Client
	watch     *NodeWatch
	reader    *nodeReader
	node      string
	cfg       TaintConfig
	log       *slog.Logger
	safeguard Safeguard

	refusedGauge prometheus.Gauge
	maxFraction  prometheus.Gauge
	writes       *prometheus.CounterVec

	// backoff spaces Run's retries while the API server fails.
	backoff wait.Backoff

	// clearer acts on ClearFaultsAnnotation; Run sets the monitor.
	clearer FaultClearer

	// State of the last reconcile, to log dry-run and refusal once.
	refused    bool
	lastDryRun string
	// mayHold says the safeguard may count this node as tainted: after
	// it allowed the taint, and at start (a previous run's taint).
	mayHold bool
}

// NewTainter builds the tainter of the node watch follows, with the
// slot safeguard (Slots, in cfg.LeaseNamespace; SetSafeguard replaces
// it). cfg is used with its defaults applied; validate it first
// (TaintConfig.Validate). reg may be nil; registering its metrics on reg
// twice is an error, not a panic.
func NewTainter(c Clients, watch *NodeWatch, cfg TaintConfig, log *slog.Logger, reg prometheus.Registerer) (*Tainter, error) {
	cfg = cfg.WithDefaults()
	if c.Core == nil || c.Meta == nil {
		return nil, fmt.Errorf("tainter of node %s: needs both the typed and the metadata client", watch.Name())
	}
	client := c.Core
	t := &Tainter{
		client: client, watch: watch, reader: newNodeReader(watch, client, log), node: watch.Name(), cfg: cfg, log: log,
		safeguard: NewSlots(client, c.Meta, watch.Name(), cfg.SafeguardConfig(), log),
		refusedGauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_node_agent_taint_refused",
			Help: "1 while the fleet safeguard refuses to taint this unfit node because too many nodes already carry the taint.",
		}),
		// The fleet alert (deploy/prometheus) compares the fraction of
		// unfit nodes with it, whatever the agents were configured with.
		maxFraction: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpu_node_agent_taint_max_fraction",
			Help: "The fleet safeguard's taint.maxFraction: at most this fraction of the nodes taint.nodeSelector selects may carry the taint (one node always may).",
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpu_node_agent_kube_api_writes_total",
			Help: "Writes the tainter made to the Kubernetes API, by kind (taint, condition, event, annotation).",
		}, []string{"kind"}),
		backoff: RetryBackoff(),
		mayHold: true,
	}
	t.maxFraction.Set(cfg.MaxFraction)
	if reg != nil {
		for _, c := range []prometheus.Collector{t.refusedGauge, t.maxFraction, t.writes} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("tainter metrics: %w", err)
			}
		}
	}
	return t, nil
}

// SetSafeguard replaces the fleet safeguard (before Run).
func (t *Tainter) SetSafeguard(s Safeguard) { t.safeguard = s }

// SetFaultClearer sets what acts on the clear-faults annotation (Run uses
// its health source when that is a FaultClearer and none is set).
func (t *Tainter) SetFaultClearer(c FaultClearer) { t.clearer = c }

// Run reconciles the Node with src's fitness until ctx ends: at start, on
// every change of health, on every event of the node informer (a change
// of the Node, such as our taint removed by someone, or the informer's
// resync: a cache read, no request), and with jittered exponential
// backoff while the API server fails. With mode off it returns at once.
func (t *Tainter) Run(ctx context.Context, src Health) error {
	if t.cfg.Mode == TaintOff {
		t.log.Info("node tainting is off")
		return nil
	}
	if c, ok := src.(FaultClearer); ok && t.clearer == nil {
		t.clearer = c
	}
	changes := src.Subscribe()
	nodeChanged := t.watch.Subscribe()
	backoff := t.backoff
	for {
		err := t.Reconcile(ctx, src.Fitness())
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// While backing off, health and Node changes wait: the retry
			// reads the latest of both.
			d := backoff.Step()
			t.log.Warn("updating node taint/condition failed; retrying", "node", t.node, "err", err, "retry", d)
			timer := time.NewTimer(d)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
			continue
		}
		backoff = t.backoff
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-nodeChanged:
		}
	}
}

// Reconcile makes the Node reflect f once: taint, condition, events. A
// clear-faults annotation on the Node is acted on first; the fitness it
// changes arrives with the monitor's next change signal. The Node is read
// from the informer's cache; a write refused with Conflict waits for the
// informer to deliver the newer Node (or reads it once) and is retried.
// Before returning, Reconcile waits (briefly) for the informer to deliver
// its writes, so that the next reconcile compares with them.
func (t *Tainter) Reconcile(ctx context.Context, f health.Fitness) error {
	if t.cfg.Mode == TaintOff {
		return nil
	}
	var (
		node    *corev1.Node
		refused bool
		asked   bool // the safeguard, at most once per reconcile
		allowed bool
		written *corev1.Node // the API server's answer to our last write
	)
	defer func() {
		if written != nil {
			t.reader.wrote(ctx, written)
		}
	}()
	err := retry.OnError(conflictBackoff(), apierrors.IsConflict, func() error {
		var err error
		if node, err = t.reader.read(ctx); err != nil {
			return err
		}
		patched, err := t.clearFaults(ctx, node)
		if err != nil {
			return err
		}
		if patched != nil {
			node, written = patched, patched
		}
		refused = false
		if !f.Fit && !hasTaint(node.Spec.Taints, t.cfg.Key) {
			if !asked && t.cfg.Mode == TaintDryRun {
				// A dry run takes no slot: it logs the taint it would add.
				allowed, asked = true, true
			}
			if !asked {
				if allowed, err = t.safeguard.Allow(ctx); err != nil {
					return fmt.Errorf("fleet safeguard: %w", err)
				}
				asked = true
				t.mayHold = t.mayHold || allowed
			}
			refused = !allowed
		}
		want := t.desiredTaints(node.Spec.Taints, f, refused)
		if sameTaints(node.Spec.Taints, want) {
			return nil
		}
		patched, err = t.patchTaints(ctx, node, want)
		if apierrors.IsConflict(err) {
			t.reader.conflicted(ctx, node.ResourceVersion)
		}
		if err != nil {
			return err
		}
		if patched != nil {
			node, written = patched, patched
		}
		return nil
	})
	if err != nil {
		return err
	}
	t.noteRefusal(ctx, node, f, refused)
	patched, err := t.reconcileCondition(ctx, node, f)
	if err != nil {
		return err
	}
	if patched != nil {
		written = patched
	}
	if f.Fit && t.mayHold && t.cfg.Mode != TaintDryRun && !hasTaint(node.Spec.Taints, t.cfg.Key) {
		if err := t.safeguard.Release(ctx); err != nil {
			return fmt.Errorf("fleet safeguard release: %w", err)
		}
		t.mayHold = false
	}
	return nil
}

// hasTaint says whether taints hold one with key.
func hasTaint(taints []corev1.Taint, key string) bool {
	return slices.ContainsFunc(taints, func(x corev1.Taint) bool { return x.Key == key })
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
func (t *Tainter) desiredTaints(existing []corev1.Taint, f health.Fitness, refused bool) []corev1.Taint {
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

// patchTaints replaces the taint list, guarded by the resourceVersion of
// the Node compared with: a concurrent writer makes it fail with Conflict,
// so taints others added meanwhile are never lost. It returns the patched
// Node (nil in dry-run mode).
func (t *Tainter) patchTaints(ctx context.Context, node *corev1.Node, want []corev1.Taint) (*corev1.Node, error) {
	if want == nil {
		want = []corev1.Taint{}
	}
	patch := map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": want},
	}
	if t.dryRun("taints", want) {
		return nil, nil
	}
	body, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode taint patch: %w", err)
	}
	patched, err := t.client.Nodes().Patch(ctx, t.node, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("patch taints of node %s: %w", t.node, err)
	}
	t.writes.WithLabelValues("taint").Inc()
	t.log.Info("node taints updated", "node", t.node, "taints", len(want), "ours", len(t.ourTaints(want)))
	return patched, nil
}

// noteRefusal updates the refusal gauge and posts one event when a
// refusal starts.
func (t *Tainter) noteRefusal(ctx context.Context, node *corev1.Node, f health.Fitness, refused bool) {
	t.refusedGauge.Set(boolGauge(refused))
	if refused && !t.refused {
		t.event(ctx, node, corev1.EventTypeWarning, "TaintRefused",
			"fleet safeguard: too many nodes already carry "+t.cfg.Key+"; not tainting. "+f.Message)
	}
	t.refused = refused
}

// reconcileCondition sets the condition if its status, reason or message
// differ, and posts an event for the change. It returns the patched Node,
// nil when nothing was written.
func (t *Tainter) reconcileCondition(ctx context.Context, node *corev1.Node, f health.Fitness) (*corev1.Node, error) {
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
		return nil, nil
	}
	if old == nil && f.Fit && t.cfg.Mode == TaintDryRun {
		return nil, nil
	}
	now := metav1.Now()
	transition := now
	if old != nil && old.Status == status {
		transition = old.LastTransitionTime
	}
	cond := corev1.NodeCondition{Type: ctype, Status: status, Reason: reason, Message: msg,
		LastHeartbeatTime: now, LastTransitionTime: transition}
	if t.dryRun("condition", cond) {
		return nil, nil
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return nil, fmt.Errorf("encode condition patch: %w", err)
	}
	patched, err := t.client.Nodes().Patch(ctx, t.node, types.StrategicMergePatchType, body, metav1.PatchOptions{}, "status")
	if err != nil {
		return nil, fmt.Errorf("patch condition %s of node %s: %w", ctype, t.node, err)
	}
	t.writes.WithLabelValues("condition").Inc()
	t.log.Info("node condition updated", "node", t.node, "condition", ctype, "status", status, "reason", reason, "message", msg)
	if old == nil && f.Fit {
		return patched, nil // first report of a healthy node is not a transition
	}
	t.event(ctx, node, evType, evReason, msg)
	return patched, nil
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
	if _, err := t.client.Events(t.cfg.EventNamespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
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

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

package kubeapi

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/signals"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
)

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
	client    kubernetes.Interface
	watch     *NodeWatch
	reader    *nodeReader
	w         *nodeWriter
	node      string
	cfg       TaintConfig
	log       *slog.Logger
	safeguard Safeguard

	refusedGauge prometheus.Gauge
	maxFraction  prometheus.Gauge

	// backoff spaces Run's retries while the API server fails.
	backoff wait.Backoff

	// clearer acts on ClearFaultsAnnotation; Run sets the monitor.
	clearer FaultClearer

	// State of the last reconcile, to post a refusal once.
	refused bool
	// mayHold says the safeguard may hold something for this node that
	// Release gives back: a slot after it allowed the taint (and at
	// start, a previous run's), or, after a refusal, the watch a refused
	// node follows a bucket of slots with.
	mayHold bool
}

// NewTainter builds the tainter of the node watch follows, with the
// slot safeguard (Slots, in cfg.LeaseNamespace; SetSafeguard replaces
// it). cfg is used with its defaults applied; validate it first
// (TaintConfig.Validate). reg may be nil; registering its metrics on reg
// twice is an error, not a panic.
func NewTainter(c Clients, watch *NodeWatch, cfg TaintConfig, log *slog.Logger, reg prometheus.Registerer) (*Tainter, error) {
	writes := newWritesCounter()
	if reg != nil {
		if err := reg.Register(writes); err != nil {
			return nil, fmt.Errorf("tainter metrics: %w", err)
		}
	}
	t, err := newTainter(c, watch, cfg, log, reg, writes)
	if err != nil && reg != nil {
		reg.Unregister(writes)
	}
	return t, err
}

// newTainter is NewTainter counting its writes in writes, which the
// caller registers.
func newTainter(c Clients, watch *NodeWatch, cfg TaintConfig, log *slog.Logger, reg prometheus.Registerer, writes *prometheus.CounterVec) (*Tainter, error) {
	cfg = cfg.WithDefaults()
	if c.Core == nil || c.Meta == nil {
		return nil, fmt.Errorf("tainter of node %s: needs both the typed and the metadata client", watch.Name())
	}
	client := c.Core
	t := &Tainter{
		client: client, watch: watch, reader: newNodeReader(watch, client, log), node: watch.Name(), cfg: cfg, log: log,
		w:         newNodeWriter(client, watch.Name(), cfg.EventNamespace, "gpu-node-agent.io/health", cfg.Mode == TaintDryRun, writes, log),
		safeguard: safeguard.New(client, c.Meta, watch.Name(), cfg.SafeguardConfig(), log),
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
		backoff: RetryBackoff(),
		mayHold: true,
	}
	t.maxFraction.Set(cfg.MaxFraction)
	if reg != nil {
		for _, c := range []prometheus.Collector{t.refusedGauge, t.maxFraction} {
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
// resync: a cache read, no request), when a refusing safeguard signals
// room (RoomSignaller), and with jittered exponential backoff while the
// API server fails. With mode off it returns at once.
func (t *Tainter) Run(ctx context.Context, src Health) error {
	if t.cfg.Mode == TaintOff {
		t.log.Info("node tainting is off")
		return nil
	}
	if c, ok := src.(FaultClearer); ok && t.clearer == nil {
		t.clearer = c
	}
	changed := src.Subscribe()
	if r, ok := t.safeguard.(RoomSignaller); ok {
		// A refused node asks again as soon as a slot may be free.
		changed = signals.FanIn(ctx, changed, r.Room())
	}
	reconcileLoop(ctx, t.backoff, func(ctx context.Context) error { return t.Reconcile(ctx, src.Fitness()) },
		func(err error, retry time.Duration) {
			t.log.Warn("updating node taint/condition failed; retrying", "node", t.node, "err", err, "retry", retry)
		}, changed, t.watch.Subscribe())
	return nil
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
		refused bool
		asked   bool // the safeguard, at most once per reconcile
		allowed bool
	)
	node, written, err := t.w.syncTaints(ctx, t.reader, t.cfg.Key, func(node *corev1.Node) (*corev1.Node, []corev1.Taint, bool, error) {
		patched, err := t.clearFaults(ctx, node)
		if err != nil {
			return nil, nil, false, err
		}
		if patched != nil {
			node = patched
		}
		refused = false
		if !f.Fit && !hasTaint(node.Spec.Taints, t.cfg.Key) {
			if !asked && t.cfg.Mode == TaintDryRun {
				// A dry run takes no slot: it logs the taint it would add.
				allowed, asked = true, true
			}
			if !asked {
				if allowed, err = t.safeguard.Allow(ctx); err != nil {
					return patched, nil, false, fmt.Errorf("fleet safeguard: %w", err)
				}
				// Allowed or refused, the safeguard may now hold a slot
				// or a watch for this node: Release once it is fit.
				asked, t.mayHold = true, true
			}
			refused = !allowed
		}
		return patched, t.desiredTaints(node.Spec.Taints, f, refused), true, nil
	})
	defer func() {
		if written != nil {
			t.reader.wrote(ctx, written)
		}
	}()
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

// ourTaints are the taints with our key.
func (t *Tainter) ourTaints(taints []corev1.Taint) []corev1.Taint {
	return taintsWithKey(taints, t.cfg.Key)
}

// desiredTaints is existing with our taints replaced by those f calls for.
func (t *Tainter) desiredTaints(existing []corev1.Taint, f health.Fitness, refused bool) []corev1.Taint {
	if f.Fit || refused {
		return withTaints(existing, t.cfg.Key)
	}
	value := f.Reason
	if len(validation.IsValidLabelValue(value)) > 0 || value == "" {
		value = "unhealthy"
	}
	effects := []corev1.TaintEffect{corev1.TaintEffect(t.cfg.Effect)}
	if t.cfg.NoExecuteForNodeFaults && f.NodeWide && effects[0] != corev1.TaintEffectNoExecute {
		effects = append(effects, corev1.TaintEffectNoExecute)
	}
	var ours []corev1.Taint
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
		ours = append(ours, taint)
	}
	return withTaints(existing, t.cfg.Key, ours...)
}

// noteRefusal updates the refusal gauge and posts one event when a
// refusal starts.
func (t *Tainter) noteRefusal(ctx context.Context, node *corev1.Node, f health.Fitness, refused bool) {
	t.refusedGauge.Set(boolGauge(refused))
	if refused && !t.refused {
		t.w.event(ctx, node, corev1.EventTypeWarning, "TaintRefused",
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
	old := findCondition(node, t.cfg.ConditionType)
	if old == nil && f.Fit && t.cfg.Mode == TaintDryRun {
		return nil, nil
	}
	patched, wrote, err := t.w.setCondition(ctx, node, t.cfg.ConditionType, status, reason, msg, time.Time{})
	if err != nil || !wrote {
		return patched, err
	}
	if old == nil && f.Fit {
		return patched, nil // first report of a healthy node is not a transition
	}
	t.w.event(ctx, node, evType, evReason, msg)
	return patched, nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

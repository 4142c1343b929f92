package kubeapi

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// NodeObjectConfig configures a NodeObject.
type NodeObjectConfig struct {
	// NodeName is this node's Node object.
	NodeName string
	// Taint configures the tainter; Mode off (after defaults) runs none.
	Taint TaintConfig
	// Labels keeps the topology labels and annotations on the Node.
	Labels bool
	// MIGStrategy is the served MIG strategy, which the labels describe.
	MIGStrategy string
	// Sharing is the time-sliced resources, which the labels describe.
	Sharing topology.Sharing
	// NewClients builds the API clients; it is retried until it succeeds.
	NewClients func() (Clients, error)
	// Retry is the first delay between failed client builds (jittered,
	// doubling); one second when zero.
	Retry time.Duration
	// Preflight gates the node on the agent's preflight (SetPreflight):
	// its own taint and condition, whatever Taint.Mode says; nil runs no
	// gate.
	Preflight *PreflightGateConfig
	// Remediation, when set, makes Remediation() ready once the informer
	// runs: the remediation shares the taint's fleet-safeguard slot.
	Remediation bool
	// PodUID is the agent's own pod, which remediation never evicts.
	PodUID string
	// MoveAdvice keeps the move advice (SetMoveAdvice) on the Node as
	// MoveAdviceAnnotation, the pods it names read from the API server
	// for their priority and owner. Off, the annotation is never written
	// (and, with Labels, one an earlier run left is removed).
	MoveAdvice bool
	// Clock times the move advice's writes (nil: the real clock).
	Clock clock.Clock
}

// NodeObject keeps this node's Node object in step with the agent: the
// health taint and condition (Tainter), the preflight taint and condition
// (the preflight gate), the topology labels and annotations and the move
// advice annotation (Labeler), all reading the Node from one informer
// scoped to it (NodeWatch), and the Events other parts post about the
// node (NodeEvents). The agent serves devices whether or not the API
// server is reachable: the client is built, and every write retried, in
// the background.
type NodeObject struct {
	cfg    NodeObjectConfig
	health Health
	reg    prometheus.Registerer
	log    *slog.Logger
	events *NodeEvents

	// writes counts the tainter's and the gate's writes.
	writes *prometheus.CounterVec

	node atomic.Pointer[topology.Node]
	kick chan struct{}

	// verdict is the latest preflight verdict (nil: none yet);
	// preflightKick signals a new one to the gate. rerun signals an
	// operator's re-run request the gate has taken.
	verdict       atomic.Pointer[PreflightVerdict]
	preflightKick chan struct{}
	rerun         chan struct{}

	// watch is the node informer, set once (nil when none runs) before
	// watchSet is closed.
	watch     *NodeWatch
	watchSet  chan struct{}
	watchOnce sync.Once

	// remediation is the remediation's API (nil unless configured).
	remediation *RemediationAPI
	// advice renders the move advice annotation (nil unless
	// NodeObjectConfig.MoveAdvice).
	advice *moveAdvisor
}

// NewNodeObject returns the node object for cfg; the tainter follows
// health. Nothing talks to the API server until Run; Events queue until
// then.
func NewNodeObject(cfg NodeObjectConfig, health Health, reg prometheus.Registerer, log *slog.Logger) *NodeObject {
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	taint := cfg.Taint.WithDefaults()
	events := newNodeEvents(cfg.NodeName, taint.EventNamespace, taint.Mode == TaintDryRun, log.With("component", "events"))
	if err := events.register(reg); err != nil {
		log.Error("node events counters not registered", "err", err)
	}
	writes := newWritesCounter()
	if reg != nil {
		if err := reg.Register(writes); err != nil {
			log.Error("kube API write counter not registered", "err", err)
		}
	}
	o := &NodeObject{cfg: cfg, health: health, reg: reg, log: log, events: events, writes: writes,
		kick: make(chan struct{}, 1), preflightKick: make(chan struct{}, 1), rerun: make(chan struct{}, 1),
		watchSet: make(chan struct{})}
	if cfg.Remediation {
		o.remediation = &RemediationAPI{ownPod: types.UID(cfg.PodUID), events: events, log: log.With("component", "remediation"),
			changes: make(chan struct{}, 1)}
	}
	if cfg.MoveAdvice {
		clk := cfg.Clock
		if clk == nil {
			clk = clock.RealClock{}
		}
		o.advice = newMoveAdvisor(log.With("component", "move-advice"), clk, MoveAdviceInterval, o.kickLabels)
	}
	return o
}

// kickLabels wakes the labeler; it never blocks.
func (o *NodeObject) kickLabels() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// SetMoveAdvice is told the node's move advice whenever it changes
// (usage.AdviceObserver); podUIDs maps its pods (namespace/name) to their
// UIDs where known. The Node's MoveAdviceAnnotation follows it, no more
// often than MoveAdviceInterval. It never blocks; without
// NodeObjectConfig.MoveAdvice it does nothing.
func (o *NodeObject) SetMoveAdvice(n *topology.Node, a topology.MoveAdvice, podUIDs map[string]string) {
	if o.advice == nil {
		return
	}
	o.advice.set(adviceInput{node: n, advice: a, uids: podUIDs})
}

// Remediation is the remediation's view of the API server (nil unless
// NodeObjectConfig.Remediation); it is ready once Run has started the
// node informer.
func (o *NodeObject) Remediation() *RemediationAPI { return o.remediation }

// Event queues an Event about the node (type corev1.EventTypeNormal or
// EventTypeWarning); it never blocks. It is posted into
// taint.eventNamespace once the API client exists, or logged in dry-run
// mode.
func (o *NodeObject) Event(eventType, reason, message string) {
	o.events.Event(eventType, reason, message)
}

// SetNode is told every discovered node; the labels and annotations follow
// it.
func (o *NodeObject) SetNode(n *topology.Node) {
	o.node.Store(n)
	o.kickLabels()
}

// SetPreflight is told the preflight verdict; the gate (when
// NodeObjectConfig.Preflight is set) reconciles the Node with the latest.
// It never blocks. A verdict always wins over the record of an earlier
// run: one not passed taints even a proven node.
func (o *NodeObject) SetPreflight(v PreflightVerdict) {
	o.verdict.Store(&v)
	select {
	case o.preflightKick <- struct{}{}:
	default:
	}
}

// PreflightRerun is signalled when the gate has taken an operator's
// re-run request (PreflightRerunAnnotation): the node is tainted pending
// and the verdict held dropped; the agent then runs every item again,
// whatever the Node's record says, and hands the verdict to SetPreflight.
// Requests taken before the agent reads coalesce into one.
func (o *NodeObject) PreflightRerun() <-chan struct{} { return o.rerun }

// takeRerun is the gate's rerun: the verdict of the run before the
// request no longer decides.
func (o *NodeObject) takeRerun() {
	o.verdict.Store(nil)
	select {
	case o.rerun <- struct{}{}:
	default:
	}
}

// PreflightRecord waits (until ctx ends) for the node informer's first
// sync and returns whether the Node already carries the preflight
// condition (NodeObjectConfig.Preflight's, DefaultPreflightCondition
// without one) True, i.e. a node proven by an earlier run, which a
// restarted agent must neither taint again nor re-run the disruptive
// items on, and a copy of the Node's labels. Run must be running: it
// starts the informer once the API client exists. It fails when no
// informer runs (taint off, labels off and no gate, or the informer could
// not be built) or the Node does not exist.
func (o *NodeObject) PreflightRecord(ctx context.Context) (proven bool, labels map[string]string, err error) {
	select {
	case <-o.watchSet:
	case <-ctx.Done():
		return false, nil, fmt.Errorf("preflight record of node %s: node informer not started: %w", o.cfg.NodeName, context.Cause(ctx))
	}
	if o.watch == nil {
		return false, nil, fmt.Errorf("preflight record of node %s: no node informer runs", o.cfg.NodeName)
	}
	if err := o.watch.WaitSynced(ctx); err != nil {
		return false, nil, fmt.Errorf("preflight record: %w", err)
	}
	n, err := o.watch.Node()
	if err != nil {
		return false, nil, fmt.Errorf("preflight record: %w", err)
	}
	condition, boot := DefaultPreflightCondition, time.Time{}
	if o.cfg.Preflight != nil {
		condition, boot = o.cfg.Preflight.WithDefaults().ConditionType, o.cfg.Preflight.BootTime
	}
	labels = maps.Clone(n.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	return preflightProven(n, condition, boot), labels, nil
}

// setWatch records the node informer (nil: none runs) for
// PreflightRecord; only the first call counts.
func (o *NodeObject) setWatch(w *NodeWatch) {
	o.watchOnce.Do(func() {
		o.watch = w
		close(o.watchSet)
	})
}

// want is what the labeler applies: with Labels, the latest discovered
// node's labels and annotations (none before the first); with
// MoveAdvice, the move advice annotation once the advice is known. Each
// part is applied without the other: a discovery that is never complete
// does not hold the advice back, and an advice change rewrites no label.
// With Labels and not MoveAdvice the advice annotation is kept absent.
func (o *NodeObject) want() (nodeMeta, bool) {
	m := nodeMeta{annotations: map[string]string{}}
	if n := o.node.Load(); o.cfg.Labels && n != nil {
		m.labels, m.ownLabels = topology.Labels(n, o.cfg.MIGStrategy, o.cfg.Sharing), true
		m.annotations = topology.Annotations(n)
		m.keys = topology.AnnotationKeys()
		if o.advice == nil {
			m.keys = append(m.keys, MoveAdviceAnnotation)
		}
	}
	if o.advice != nil {
		if v, known := o.advice.current(); known {
			m.keys = append(m.keys, MoveAdviceAnnotation)
			if v != "" {
				m.annotations[MoveAdviceAnnotation] = v
			}
		}
	}
	return m, len(m.keys) > 0 || m.ownLabels
}

// Run builds the client (retrying until it can), starts the node informer
// once, then runs the tainter, the preflight gate and the labeler on it
// until ctx ends. It never fails the agent: it returns nil.
func (o *NodeObject) Run(ctx context.Context) error {
	defer o.setWatch(nil) // PreflightRecord waits no longer than Run runs
	clients, ok := waitForClients(ctx, o.cfg.NewClients, o.cfg.Retry, o.log, "node taints, conditions and labels not updated")
	if !ok {
		return nil
	}
	taint := o.cfg.Taint.WithDefaults()
	var wg sync.WaitGroup
	if taint.Mode == TaintOff && !o.cfg.Labels && o.advice == nil && o.cfg.Preflight == nil && o.remediation == nil {
		// Events only: no informer on the Node.
		o.setWatch(nil)
		o.events.run(ctx, clients.Core, func() types.UID { return "" })
		return nil
	}
	watch, err := NewNodeWatch(clients.Core, o.cfg.NodeName, taint.Resync)
	if err != nil {
		o.setWatch(nil)
		o.log.Error("node taints, conditions and labels not updated", "err", err)
		return nil
	}
	o.setWatch(watch)
	wg.Go(func() { watch.Run(ctx) })
	wg.Go(func() {
		o.events.run(ctx, clients.Core, func() types.UID {
			if n, err := watch.Node(); err == nil && n != nil {
				return n.UID
			}
			return ""
		})
	})
	// The taint and remediation share this node's one slot of the fleet
	// safeguard (safeguard.Shared).
	slot := safeguard.NewShared(safeguard.New(clients.Core, clients.Meta, o.cfg.NodeName, taint.SafeguardConfig(), o.log.With("component", "safeguard")))
	if taint.Mode != TaintOff {
		if t, err := newTainter(clients, watch, taint, o.log.With("component", "taint"), o.reg, o.writes); err != nil {
			o.log.Error("node tainter not started", "err", err)
		} else {
			t.SetSafeguard(slot.User(slotUserTaint))
			wg.Go(func() { _ = t.Run(ctx, o.health) })
		}
	}
	if o.remediation != nil {
		o.remediation.start(ctx, clients.Core, watch, slot, o.writes, taint.EventNamespace)
	}
	if o.cfg.Preflight != nil {
		if err := o.cfg.Preflight.Validate(taint); err != nil {
			o.log.Error("preflight gate not started", "err", err)
		} else {
			g := newPreflightGate(clients.Core, watch, *o.cfg.Preflight, o.writes, o.log.With("component", "preflight"))
			g.rerun = o.takeRerun
			wg.Go(func() { g.run(ctx, o.preflightKick, o.verdict.Load) })
		}
	}
	if o.advice != nil {
		wg.Go(func() { o.advice.run(ctx, clients.Core) })
	}
	if o.cfg.Labels || o.advice != nil {
		l := NewLabeler(clients.Core, watch, o.log.With("component", "labels"))
		wg.Go(func() { l.run(ctx, o.kick, o.want) })
	}
	wg.Wait()
	return nil
}

// waitForClients calls newClients until it succeeds or ctx ends (false),
// logging each failure with what goes undone.
func waitForClients(ctx context.Context, newClients func() (Clients, error), retry time.Duration, log *slog.Logger, undone string) (Clients, bool) {
	backoff := RetryBackoff()
	backoff.Duration = retry
	for {
		c, err := newClients()
		if err == nil {
			return c, true
		}
		wait := backoff.Step()
		log.Error("no Kubernetes API access: "+undone+"; retrying", "err", err, "retry", wait)
		select {
		case <-ctx.Done():
			return Clients{}, false
		case <-time.After(wait):
		}
	}
}

package kubeapi

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

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
}

// NodeObject keeps this node's Node object in step with the agent: the
// health taint and condition (Tainter) and the topology labels and
// annotations (Labeler), both reading the Node from one informer scoped to
// it (NodeWatch), and the Events other parts post about the node
// (NodeEvents). The agent serves devices whether or not the API server is
// reachable: the client is built, and every write retried, in the
// background.
type NodeObject struct {
	cfg    NodeObjectConfig
	health Health
	reg    prometheus.Registerer
	log    *slog.Logger
	events *NodeEvents

	node atomic.Pointer[topology.Node]
	kick chan struct{}
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
	return &NodeObject{cfg: cfg, health: health, reg: reg, log: log, events: events, kick: make(chan struct{}, 1)}
}

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
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// want is what the labeler applies: the latest discovered node's labels
// and annotations.
func (o *NodeObject) want() (labels, annotations map[string]string, ok bool) {
	n := o.node.Load()
	if n == nil {
		return nil, nil, false
	}
	return topology.Labels(n, o.cfg.MIGStrategy, o.cfg.Sharing), topology.Annotations(n), true
}

// Run builds the client (retrying until it can), starts the node informer
// once, then runs the tainter and the labeler on it until ctx ends. It
// never fails the agent: it returns nil.
func (o *NodeObject) Run(ctx context.Context) error {
	clients, ok := waitForClients(ctx, o.cfg.NewClients, o.cfg.Retry, o.log, "node taint and labels not updated")
	if !ok {
		return nil
	}
	taint := o.cfg.Taint.WithDefaults()
	var wg sync.WaitGroup
	if taint.Mode == TaintOff && !o.cfg.Labels {
		// Events only: no informer on the Node.
		o.events.run(ctx, clients.Core, func() types.UID { return "" })
		return nil
	}
	watch, err := NewNodeWatch(clients.Core, o.cfg.NodeName, taint.Resync)
	if err != nil {
		o.log.Error("node taint and labels not updated", "err", err)
		return nil
	}
	wg.Go(func() { watch.Run(ctx) })
	wg.Go(func() {
		o.events.run(ctx, clients.Core, func() types.UID {
			if n, err := watch.Node(); err == nil && n != nil {
				return n.UID
			}
			return ""
		})
	})
	if taint.Mode != TaintOff {
		if t, err := NewTainter(clients, watch, taint, o.log.With("component", "taint"), o.reg); err != nil {
			o.log.Error("node tainter not started", "err", err)
		} else {
			wg.Go(func() { _ = t.Run(ctx, o.health) })
		}
	}
	if o.cfg.Labels {
		l := NewLabeler(clients.Core, watch, o.log.With("component", "labels"))
		wg.Go(func() { l.Run(ctx, o.kick, o.want) })
	}
	wg.Wait()
	return nil
}

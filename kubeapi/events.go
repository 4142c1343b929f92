package kubeapi

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
)

// maxQueuedEvents bounds the Events waiting to be posted: more arrive only
// from a storm of findings, and the newest say the most.
const maxQueuedEvents = 64

// nodeEvent is one Event to post about the node.
type nodeEvent struct {
	typ, reason, message string
	at                   metav1.Time
}

// NodeEvents posts Events about this node for parts of the agent other
// than the tainter (the GPU process check's findings and kills). Event
// never blocks: Events wait in a bounded queue (the oldest dropped, and
// counted, when it is full) until the API client exists, then are posted
// in order, each once: a failed post is logged, not retried, since an
// Event is a notice and the state it reports lives elsewhere (the health
// condition, the metrics). Callers post only on change, so a node makes no
// Event requests at steady state.
type NodeEvents struct {
	node      string
	namespace string
	dryRun    bool
	log       *slog.Logger
	clock     clock.PassiveClock

	// lastName is the time part of the last Event's name (run only).
	lastName int64

	mu      sync.Mutex
	queue   []nodeEvent
	wake    chan struct{}
	dropped prometheus.Counter
	posted  prometheus.Counter
}

// newNodeEvents returns the poster of node's Events into namespace (in
// dry-run mode they are logged instead).
func newNodeEvents(node, namespace string, dryRun bool, log *slog.Logger) *NodeEvents {
	return &NodeEvents{
		node: node, namespace: namespace, dryRun: dryRun, log: log, clock: clock.RealClock{},
		wake: make(chan struct{}, 1),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_node_events_dropped_total",
			Help: "Node Events (GPU process findings and kills) dropped unposted because too many were waiting for the API server.",
		}),
		posted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpu_node_agent_node_events_posted_total",
			Help: "Node Events the agent posted besides the tainter's (GPU process findings and kills).",
		}),
	}
}

// register registers the poster's counters on reg (nil: none).
func (e *NodeEvents) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{e.dropped, e.posted} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("node events metrics: %w", err)
		}
	}
	return nil
}

// Event queues an Event of type typ (corev1.EventTypeNormal or
// EventTypeWarning) about the node.
func (e *NodeEvents) Event(typ, reason, message string) {
	e.mu.Lock()
	if len(e.queue) == maxQueuedEvents {
		e.queue = e.queue[1:]
		e.dropped.Inc()
		e.log.Warn("node event dropped: too many waiting for the API server", "node", e.node)
	}
	e.queue = append(e.queue, nodeEvent{typ: typ, reason: reason, message: message, at: metav1.NewTime(e.clock.Now())})
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// run posts queued Events through client until ctx ends. uid is the
// Node's UID when known ("" until the node informer has it).
func (e *NodeEvents) run(ctx context.Context, client kubernetes.Interface, uid func() types.UID) {
	for {
		for {
			e.mu.Lock()
			if len(e.queue) == 0 {
				e.mu.Unlock()
				break
			}
			ev := e.queue[0]
			e.queue = e.queue[1:]
			e.mu.Unlock()
			e.post(ctx, client, uid(), ev)
			if ctx.Err() != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-e.wake:
		}
	}
}

func (e *NodeEvents) post(ctx context.Context, client kubernetes.Interface, uid types.UID, ev nodeEvent) {
	if uid == "" {
		// As the kubelet refers to its Node in its own Events.
		uid = types.UID(e.node)
	}
	// Named like the kubelet's events (<object>.<hex time>), the time
	// made unique: two Events queued within one clock tick must not
	// collide.
	name := max(ev.at.UnixNano(), e.lastName+1)
	e.lastName = name
	obj := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", e.node, name), Namespace: e.namespace},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: e.node, UID: uid},
		Reason:         ev.reason, Message: truncate(ev.message), Type: ev.typ,
		Source:         corev1.EventSource{Component: "gpu-node-agent", Host: e.node},
		FirstTimestamp: ev.at, LastTimestamp: ev.at, Count: 1,
		ReportingController: "gpu-node-agent.io/gpu-processes", ReportingInstance: e.node,
	}
	if e.dryRun {
		e.log.Info("dry-run: would post node event", "node", e.node, "type", ev.typ, "reason", ev.reason, "message", obj.Message)
		return
	}
	if _, err := client.CoreV1().Events(e.namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		e.log.Warn("posting node event failed", "node", e.node, "reason", ev.reason, "err", err)
		return
	}
	e.posted.Inc()
}

package main

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// nodeObject keeps this node's Node object in step with the agent: the
// health taint and condition (kubeapi.Tainter) and the topology labels and
// annotations (kubeapi.Labeler), both reading the Node from one informer
// scoped to it (kubeapi.NodeWatch). Devices are served whether or not the
// API server is reachable: the client is built, and every write retried,
// in the background.
type nodeObject struct {
	cfg Config
	log *slog.Logger
	mon *health.Monitor
	reg prometheus.Registerer
	// newClient builds the API clients (replaced in tests).
	newClient func() (kubeapi.Clients, error)
	// retry is the first delay between failed client builds (jittered,
	// doubling).
	retry time.Duration

	node atomic.Pointer[topology.Node]
	kick chan struct{}
}

func newNodeObject(cfg Config, mon *health.Monitor, reg prometheus.Registerer, log *slog.Logger) *nodeObject {
	return &nodeObject{
		cfg: cfg, log: log, mon: mon, reg: reg,
		newClient: func() (kubeapi.Clients, error) {
			return kubeapi.NewClients(cfg.Kubeconfig, "gpu-node-agent/"+version, cfg.kubeClient())
		},
		retry: time.Second,
		kick:  make(chan struct{}, 1),
	}
}

// setNode is told every discovered node; the labels and annotations follow
// it.
func (o *nodeObject) setNode(n *topology.Node) {
	o.node.Store(n)
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// want is what the labeler applies: the latest discovered node's labels
// and annotations.
func (o *nodeObject) want() (labels, annotations map[string]string, ok bool) {
	n := o.node.Load()
	if n == nil {
		return nil, nil, false
	}
	return topology.Labels(n, o.cfg.MIGStrategy), topology.Annotations(n), true
}

// run builds the client (retrying until it can), starts the node informer
// once, then runs the tainter and the labeler on it until ctx ends. It
// never fails the agent.
func (o *nodeObject) run(ctx context.Context) error {
	var clients kubeapi.Clients
	backoff := kubeapi.RetryBackoff()
	backoff.Duration = o.retry
	for {
		c, err := o.newClient()
		if err == nil {
			clients = c
			break
		}
		d := backoff.Step()
		o.log.Error("no Kubernetes API access: node taint and labels not updated; retrying", "err", err, "retry", d)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
	taint := o.cfg.Taint.WithDefaults()
	watch, err := kubeapi.NewNodeWatch(clients.Core, o.cfg.NodeName, taint.Resync)
	if err != nil {
		o.log.Error("node taint and labels not updated", "err", err)
		return nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { watch.Run(ctx) })
	if taint.Mode != kubeapi.TaintOff {
		if t, err := kubeapi.NewTainter(clients, watch, taint, o.log.With("component", "taint"), o.reg); err != nil {
			o.log.Error("node tainter not started", "err", err)
		} else {
			wg.Go(func() { _ = t.Run(ctx, o.mon) })
		}
	}
	if o.cfg.NodeLabels {
		l := kubeapi.NewLabeler(clients.Core, watch, o.log.With("component", "labels"))
		wg.Go(func() { l.Run(ctx, o.kick, o.want) })
	}
	wg.Wait()
	return nil
}

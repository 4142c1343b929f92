package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// nodeObject keeps this node's Node object in step with the agent: the
// health taint and condition (health.Tainter) and the topology labels and
// annotations (topology.NodeLabeler). Devices are served whether or not
// the API server is reachable: the client is built, and every write
// retried, in the background.
type nodeObject struct {
	cfg Config
	log *slog.Logger
	mon *health.Monitor
	reg prometheus.Registerer
	// newClient builds the API client (replaced in tests).
	newClient func() (kubernetes.Interface, error)
	// retry is the delay between failed client builds and label writes.
	retry time.Duration

	node atomic.Pointer[topology.Node]
	kick chan struct{}
}

func newNodeObject(cfg Config, mon *health.Monitor, reg prometheus.Registerer, log *slog.Logger) *nodeObject {
	return &nodeObject{
		cfg: cfg, log: log, mon: mon, reg: reg,
		newClient: func() (kubernetes.Interface, error) { return kubeClient(cfg.Kubeconfig) },
		retry:     30 * time.Second,
		kick:      make(chan struct{}, 1),
	}
}

// kubeClient builds a client from kubeconfig, or the in-cluster config
// (service account) when kubeconfig is empty.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "gpu-node-agent/" + version
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
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

// run builds the client (retrying until it can), then runs the tainter
// and the labeler until ctx ends. It never fails the agent.
func (o *nodeObject) run(ctx context.Context) error {
	var client kubernetes.Interface
	for {
		c, err := o.newClient()
		if err == nil {
			client = c
			break
		}
		o.log.Error("no Kubernetes API access: node taint and labels not updated; retrying", "err", err, "retry", o.retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.retry):
		}
	}
	var wg sync.WaitGroup
	if o.cfg.taintMode() != health.TaintOff {
		if t, err := health.NewTainter(client, o.cfg.NodeName, o.cfg.Taint.TaintConfig, o.log.With("component", "taint"), o.reg); err != nil {
			o.log.Error("node tainter not started", "err", err)
		} else {
			wg.Go(func() { _ = t.Run(ctx, o.mon) })
		}
	}
	if o.cfg.NodeLabels {
		l := topology.NewNodeLabeler(client, o.cfg.NodeName, o.log.With("component", "labels"))
		wg.Go(func() { o.label(ctx, l) })
	}
	wg.Wait()
	return nil
}

// label applies the labels and annotations (NIC↔GPU PCIe distances) of the
// latest node on every discovery (the labeler writes only what changed)
// and retries failures.
func (o *nodeObject) label(ctx context.Context, l *topology.NodeLabeler) {
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.kick:
		case <-retry:
		}
		retry = nil
		n := o.node.Load()
		if n == nil {
			continue
		}
		if err := l.Apply(ctx, topology.Labels(n, o.cfg.MIGStrategy), topology.Annotations(n)); err != nil && ctx.Err() == nil {
			o.log.Warn("node labels and annotations not updated; retrying", "node", o.cfg.NodeName, "err", err, "retry", o.retry)
			retry = time.After(o.retry)
		}
	}
}

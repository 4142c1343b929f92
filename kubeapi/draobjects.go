package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DRAObjectsConfig configures DRAObjects.
type DRAObjectsConfig struct {
	// NodeName is this node: its pool and the slices' owner.
	NodeName string
	// NewClients builds the API clients; it is retried until it succeeds.
	NewClients func() (Clients, error)
	// Retry is the first delay between failed client builds (jittered,
	// doubling); one second when zero.
	Retry time.Duration
}

// DRAObjects is the DRA driver's API-server side: this node's
// ResourceSlices (a SlicePublisher) and the ResourceClaims the kubelet
// plugin prepares (dra.ClaimGetter). The client is built in the
// background, as the NodeObject builds its own: devices set before it
// exists are published once it does, and a claim read waits for it (up to
// the caller's deadline).
type DRAObjects struct {
	cfg DRAObjectsConfig
	log *slog.Logger
	reg prometheus.Registerer

	ready   chan struct{} // closed once clients and pub are set
	clients Clients

	mu          sync.Mutex
	pub         *SlicePublisher
	pending     []resourcev1.Device
	havePending bool
}

// NewDRAObjects returns the DRA objects of cfg.NodeName; nothing talks to
// the API server until Run. reg may be nil.
func NewDRAObjects(cfg DRAObjectsConfig, log *slog.Logger, reg prometheus.Registerer) (*DRAObjects, error) {
	if cfg.NodeName == "" || cfg.NewClients == nil {
		return nil, errors.New("dra objects: node name and client builder are required")
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &DRAObjects{cfg: cfg, log: log, reg: reg, ready: make(chan struct{})}, nil
}

// SetDevices makes devs (dra.Build's devices, in order) the node's
// published devices; the latest call wins (SlicePublisher.Set). Never
// blocks.
func (d *DRAObjects) SetDevices(devs []resourcev1.Device) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pub != nil {
		d.pub.Set(devs)
		return
	}
	d.pending, d.havePending = devs, true
}

// Published reports whether the last SetDevices reached the API server.
func (d *DRAObjects) Published() bool {
	d.mu.Lock()
	pub := d.pub
	d.mu.Unlock()
	return pub != nil && pub.Published()
}

// Get reads a ResourceClaim (dra.ClaimGetter), waiting for the client
// while ctx allows.
func (d *DRAObjects) Get(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error) {
	select {
	case <-d.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("no Kubernetes API client yet: %w", ctx.Err())
	}
	return d.clients.Core.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Run builds the client (retrying until it can), then publishes the
// node's slices until ctx ends. It never fails the agent: it returns nil.
func (d *DRAObjects) Run(ctx context.Context) error {
	clients, ok := waitForClients(ctx, d.cfg.NewClients, d.cfg.Retry, d.log, "ResourceSlices not published")
	if !ok {
		return nil
	}
	pub, err := NewSlicePublisher(clients.Core, SlicePublisherConfig{NodeName: d.cfg.NodeName}, d.log, d.reg)
	if err != nil {
		d.log.Error("ResourceSlices not published", "err", err)
		return nil
	}
	d.mu.Lock()
	d.clients, d.pub = clients, pub
	if d.havePending {
		pub.Set(d.pending)
		d.pending = nil
	}
	d.mu.Unlock()
	close(d.ready)
	pub.Run(ctx)
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

package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

const (
	taintKey      = "gpu-node-agent.io/unhealthy"
	conditionType = corev1.NodeConditionType("GPUHealthy")
)

// observer follows the fleet's Nodes and slot Leases (label SlotLabel)
// with the admin's informers (one LIST and one WATCH each: not counted as
// agent traffic)
// and keeps, event by event, how many Nodes carry the taint. Events of
// one watch arrive in etcd revision order, so the running count after
// each event is the fleet's count at that revision and its maximum is
// the true maximum.
type observer struct {
	mu      sync.Mutex
	tainted map[string]bool
	cond    map[string]corev1.ConditionStatus
	leases  map[string]string // lease name -> holder
	max     int
	// reached is when the count first reached target, zero until then.
	target  int
	reached time.Time
	changed chan struct{}
}

func startObserver(ctx context.Context, c kubernetes.Interface, selector, leaseNS string) (*observer, error) {
	o := &observer{tainted: map[string]bool{}, cond: map[string]corev1.ConditionStatus{}, leases: map[string]string{},
		changed: make(chan struct{})}
	nf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = selector
	}))
	// Only the slot Leases: the namespace may hold others (kube-system
	// holds kube-apiserver's identity Lease).
	lf := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(leaseNS),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = safeguard.SlotLabel + "=" + safeguard.DefaultSlotPrefix
		}))
	nodes := nf.Core().V1().Nodes().Informer()
	leases := lf.Coordination().V1().Leases().Informer()
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.node(obj, false) },
		UpdateFunc: func(_, obj any) { o.node(obj, false) },
		DeleteFunc: func(obj any) { o.node(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("observer node handler: %w", err)
	}
	if _, err := leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.lease(obj, false) },
		UpdateFunc: func(_, obj any) { o.lease(obj, false) },
		DeleteFunc: func(obj any) { o.lease(obj, true) },
	}); err != nil {
		return nil, fmt.Errorf("observer lease handler: %w", err)
	}
	nf.Start(ctx.Done())
	lf.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, leases.HasSynced) {
		return nil, fmt.Errorf("observer informers not synced: %w", ctx.Err())
	}
	return o, nil
}

func (o *observer) node(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if deleted {
		delete(o.tainted, n.Name)
		delete(o.cond, n.Name)
	} else {
		has := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == taintKey })
		if has {
			o.tainted[n.Name] = true
		} else {
			delete(o.tainted, n.Name)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == conditionType {
				o.cond[n.Name] = c.Status
			}
		}
	}
	o.max = max(o.max, len(o.tainted))
	if o.target > 0 && o.reached.IsZero() && len(o.tainted) >= o.target {
		o.reached = time.Now()
	}
	o.signal()
}

func (o *observer) lease(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if deleted {
		delete(o.leases, l.Name)
	} else {
		h := ""
		if l.Spec.HolderIdentity != nil {
			h = *l.Spec.HolderIdentity
		}
		o.leases[l.Name] = h
	}
	o.signal()
}

// signal wakes waiters; o.mu held.
func (o *observer) signal() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// phase starts a measurement: the maximum starts again from the current
// count and reached is recorded when the count reaches target (0: never).
func (o *observer) phase(target int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.max, o.target, o.reached = len(o.tainted), target, time.Time{}
	if target > 0 && len(o.tainted) >= target {
		o.reached = time.Now()
	}
}

// state is a consistent view for a condition.
type state struct {
	tainted map[string]bool
	cond    map[string]corev1.ConditionStatus
	leases  map[string]string
	max     int
	reached time.Time
}

// wait waits until cond holds on the observed state, or timeout, and
// returns the last state seen and whether cond held.
func (o *observer) wait(ctx context.Context, timeout time.Duration, cond func(*state) bool) (*state, bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		o.mu.Lock()
		st := &state{tainted: o.tainted, cond: o.cond, leases: o.leases, max: o.max, reached: o.reached}
		ok := cond(st)
		ch := o.changed
		if ok {
			st = o.copyLocked()
		}
		o.mu.Unlock()
		if ok {
			return st, true
		}
		select {
		case <-ctx.Done():
			return o.snapshot(), false
		case <-timer.C:
			return o.snapshot(), false
		case <-ch:
		}
	}
}

func (o *observer) copyLocked() *state {
	return &state{tainted: clone(o.tainted), cond: clone(o.cond), leases: clone(o.leases), max: o.max, reached: o.reached}
}

func (o *observer) snapshot() *state {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.copyLocked()
}

func clone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// condIs says whether every named node's condition has status s.
func (st *state) condIs(names []string, s corev1.ConditionStatus) bool {
	for _, n := range names {
		if st.cond[n] != s {
			return false
		}
	}
	return true
}

// taintedAmong counts the named nodes that carry the taint.
func (st *state) taintedAmong(names []string) int {
	n := 0
	for _, name := range names {
		if st.tainted[name] {
			n++
		}
	}
	return n
}

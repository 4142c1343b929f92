package kubeapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestNodeEvents: Events queued before the API client exists are posted
// once it does, in order, about this Node in the event namespace (where
// the admission policy lets the agent write them), with the Node's UID
// once the informer has it; with taint and labels off no informer runs.
func TestNodeEvents(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    string
		labels  bool
		wantUID string
	}{
		{name: "with the node informer", mode: TaintOn, labels: true, wantUID: "uid-1"},
		{name: "events only", mode: TaintOff, wantUID: "gpu-node-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const name = "gpu-node-1"
			c := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "uid-1"}})
			ready := make(chan struct{})
			reg := prometheus.NewPedanticRegistry()
			o := NewNodeObject(NodeObjectConfig{
				NodeName: name, Taint: TaintConfig{Mode: tc.mode, MaxFraction: 1, EventNamespace: "gpu-ops"}, Labels: tc.labels,
				MIGStrategy: "none", Retry: time.Millisecond,
				NewClients: func() (Clients, error) {
					select {
					case <-ready:
						return fakeClients(t, c), nil
					default:
						return Clients{}, errors.New("no API access yet")
					}
				},
			}, newFakeHealth(fit), reg, discard())
			o.SetNode(&topology.Node{GPUs: []topology.GPU{{Index: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559}}})
			o.Event(corev1.EventTypeWarning, "GPUZombieProcess", "zombie process 4242 (python3) on GPU-0")
			o.Event(corev1.EventTypeWarning, "GPUZombieKilled", "sent SIGTERM to zombie process 4242")
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { _ = o.Run(ctx) })
			defer func() { cancel(); wg.Wait() }()
			if tc.labels {
				// The informer must have the Node for its UID: wait for
				// the labels it drives before the client-less window ends.
				close(ready)
				testutil.WaitFor(t, "the labels", func() bool {
					n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
					return err == nil && n.Annotations[OwnedLabelsAnnotation] != ""
				})
			} else {
				close(ready)
			}
			var evs []corev1.Event
			testutil.WaitFor(t, "both events posted", func() bool {
				l, err := c.CoreV1().Events("gpu-ops").List(ctx, metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				evs = l.Items
				return len(evs) == 2
			})
			reasons := map[string]corev1.Event{}
			for _, e := range evs {
				reasons[e.Reason] = e
			}
			for _, r := range []string{"GPUZombieProcess", "GPUZombieKilled"} {
				e, ok := reasons[r]
				if !ok {
					t.Fatalf("no %s event in %+v", r, evs)
				}
				if e.InvolvedObject.Kind != "Node" || e.InvolvedObject.Name != name || e.Type != corev1.EventTypeWarning ||
					e.Source.Component != "gpu-node-agent" || !strings.HasPrefix(e.Name, name+".") {
					t.Errorf("event %+v", e)
				}
			}
			// The first was queued before the informer could have the
			// UID; any event posted after it synced carries it.
			o.Event(corev1.EventTypeNormal, "Later", "after sync")
			testutil.WaitFor(t, "the later event", func() bool {
				l, _ := c.CoreV1().Events("gpu-ops").List(ctx, metav1.ListOptions{})
				for _, e := range l.Items {
					if e.Reason == "Later" {
						if string(e.InvolvedObject.UID) != tc.wantUID {
							t.Errorf("later event's involved UID = %q, want %q", e.InvolvedObject.UID, tc.wantUID)
						}
						return true
					}
				}
				return false
			})
			// Counted once the create has returned, just after the fake
			// stores it.
			testutil.WaitFor(t, "node_events_posted_total 3", func() bool { return promtestutil.ToFloat64(o.events.posted) == 3 })
			if !tc.labels {
				for _, a := range c.Actions() {
					if a.GetResource().Resource == "nodes" {
						t.Errorf("events only, yet a Node request: %s", a.GetVerb())
					}
				}
			}
		})
	}
}

// TestNodeEventsBounded: a storm of Events while the API server is away
// keeps the newest maxQueuedEvents and counts the rest as dropped; a
// failed post is logged and not retried.
func TestNodeEventsBounded(t *testing.T) {
	e := newNodeEvents("gpu-node-1", "default", false, discard())
	e.clock = clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	for i := range maxQueuedEvents + 5 {
		e.Event(corev1.EventTypeWarning, "GPUForeignProcess", fmt.Sprintf("finding %d", i))
	}
	if got := promtestutil.ToFloat64(e.dropped); got != 5 {
		t.Errorf("dropped = %v, want 5", got)
	}
	c := newFake(t)
	fails := 0
	c.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if msg := a.(k8stesting.CreateAction).GetObject().(*corev1.Event).Message; msg == "finding 5" {
			fails++
			return true, nil, errors.New("etcd timeout")
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.run(ctx, c, func() types.UID { return "" }) }()
	testutil.WaitFor(t, "the queue drained", func() bool { return promtestutil.ToFloat64(e.posted) == maxQueuedEvents-1 })
	cancel()
	<-done
	l, err := c.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != maxQueuedEvents-1 || fails != 1 {
		t.Fatalf("posted %d events with %d failures, want %d and 1", len(l.Items), fails, maxQueuedEvents-1)
	}
	for _, ev := range l.Items {
		if ev.Message == "finding 0" {
			t.Error("the oldest event was kept, want it dropped")
		}
	}
}

// TestNodeEventsDryRun: in taint dry-run mode node Events are logged, not
// posted.
func TestNodeEventsDryRun(t *testing.T) {
	e := newNodeEvents("gpu-node-1", "default", true, discard())
	e.Event(corev1.EventTypeWarning, "GPUZombieProcess", "zombie")
	c := newFake(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.run(ctx, c, func() types.UID { return "" }) }()
	testutil.WaitFor(t, "the queue drained", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.queue) == 0 })
	cancel()
	<-done
	for _, a := range c.Actions() {
		if a.GetVerb() == "create" {
			t.Errorf("dry-run created %s", a.GetResource().Resource)
		}
	}
}

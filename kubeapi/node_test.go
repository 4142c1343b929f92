package kubeapi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestNodeObject: with no API access at first, the node object keeps
// retrying the client; once it has one, the Node gets the discovered
// node's labels and annotations, and the taint follows the fitness.
func TestNodeObject(t *testing.T) {
	tests := []struct {
		name       string
		mode       string
		labels     bool
		wantLabels bool
		wantTaint  bool
	}{
		{name: "taint and labels", mode: TaintOn, labels: true, wantLabels: true, wantTaint: true},
		{name: "labels only", mode: TaintOff, labels: true, wantLabels: true},
		{name: "taint only", mode: TaintOn, wantTaint: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const name = "gpu-node-1"
			c := newFake(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			var tries atomic.Int32
			h := newFakeHealth(fit)
			o := NewNodeObject(NodeObjectConfig{
				NodeName:    name,
				Taint:       TaintConfig{Mode: tc.mode, MaxFraction: 1},
				Labels:      tc.labels,
				MIGStrategy: "none",
				Retry:       time.Millisecond,
				NewClients: func() (Clients, error) {
					if tries.Add(1) == 1 {
						return Clients{}, errors.New("no kubeconfig") // no API access at start
					}
					return fakeClients(t, c), nil
				},
			}, h, nil, discard())
			node := &topology.Node{GPUs: []topology.GPU{{Index: 0, UUID: "GPU-0", Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559}}}
			o.SetNode(node)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				if err := o.Run(ctx); err != nil {
					t.Errorf("Run: %v", err)
				}
			})
			defer func() { cancel(); wg.Wait() }()
			get := func() *corev1.Node {
				n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			tainted := func() bool { return hasTaint(get().Spec.Taints, TaintConfig{}.WithDefaults().Key) }
			if tc.wantLabels {
				want := topology.Labels(node, "none", nil)
				testutil.WaitFor(t, "the topology labels", func() bool {
					n := get()
					for k, v := range want {
						if n.Labels[k] != v {
							return false
						}
					}
					return n.Annotations[OwnedLabelsAnnotation] != ""
				})
			}
			if tc.wantTaint {
				h.set(unfit)
				testutil.WaitFor(t, "the taint while unfit", tainted)
				h.set(fit)
				testutil.WaitFor(t, "the taint removed once fit", func() bool { return !tainted() })
			}
			if tries.Load() < 2 {
				t.Errorf("%d client builds, want a retry after the first failed", tries.Load())
			}
			if !tc.wantLabels {
				if n := get(); n.Annotations[OwnedLabelsAnnotation] != "" {
					t.Errorf("labels applied with labels off: %v", n.Labels)
				}
			}
		})
	}
}

package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/sim/simtest"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

// TestRunTaintSurvivesAgentRestart: the taint of a GPU held unhealthy
// (XID 79, not reset) never leaves the Node across an agent restart. A
// Monitor (with its sampler) and a Tainter run with a state dir; once the
// Node is tainted, a watch records every update of it while they stop and
// a new Monitor and Tainter start on the same state dir and the same
// simulated node (the GPU still faulted). The new Tainter runs before the
// new Monitor reads NVML at all, so its first reconcile sees only what
// NewMonitor restored; then the Monitor runs, and the test waits for a
// sampling cycle it applied and a full reconcile after it. No recorded
// update may lack the taint. Without a state dir (the negative control)
// the same restart removes it, which shows the recording can see a gap.
// Either way a GPU reset then ends the fault and the taint.
func TestRunTaintSurvivesAgentRestart(t *testing.T) {
	t.Parallel()
	c := cluster.Start(t, cluster.Options{})
	tests := []struct {
		name    string
		node    string
		persist bool
	}{
		{"with state dir the taint never leaves", "gpu-restart-persist", true},
		{"without state dir the taint is removed (negative control)", "gpu-restart-nostate", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			createNode(t, c.Client, tc.node)
			const recovery = 500 * time.Millisecond
			cfg := health.Config{PollInterval: 200 * time.Millisecond, RecoveryPeriod: recovery, MaxRecoveryPeriod: recovery}
			if tc.persist {
				cfg.StateDir = t.TempDir()
			}
			const gpuIndex = 3
			simNode := newSimNode(t)
			taintCfg := kubeapi.TaintConfig{MaxFraction: 1, Resync: 200 * time.Millisecond}

			first := runSimMonitor(t, simNode, cfg)
			tainter, err := newTainter(t, clientsFor(t, c.RESTConfig), tc.node, taintCfg, discard(), nil)
			if err != nil {
				t.Fatal(err)
			}
			stopTainter := runTainter(t, tainter, first.mon)
			simtest.Fault(t, simNode, http.MethodPost, fmt.Sprintf(`{"kind":"xid","gpu":%d,"xid":79}`, gpuIndex))
			// Both causes (the XID and the driver's reset request, read by
			// the sampler) on the Node, so the state file holds both.
			first.awaitResetRequested(t)
			testutil.WaitForWithin(t, 30*time.Second, "the node tainted with GPUHealthy=False naming both causes", func() bool {
				n := getNode(t, c.Client, tc.node)
				cond := condition(n, "GPUHealthy")
				f := first.mon.Fitness()
				return tainted(n) && cond != nil && cond.Status == corev1.ConditionFalse && cond.Message == f.Message
			})
			start := getNode(t, c.Client, tc.node)
			rec := recordNode(t, c.Client, tc.node, start.ResourceVersion)

			// The restart.
			stopTainter()
			first.stop()
			second := buildSimMonitor(t, simNode, cfg)
			counter := newAPICounter()
			tainter, err = newTainter(t, countedClients(t, c.RESTConfig, counter), tc.node, taintCfg, discard(), nil)
			if err != nil {
				t.Fatal(err)
			}
			src := &countingHealth{Monitor: second.mon}
			runTainter(t, tainter, src)
			// The second reconcile (the informer resyncs every 200ms)
			// starts after the first one (on the restored state alone) has
			// finished.
			testutil.WaitForWithin(t, 30*time.Second, "the new tainter's first reconcile", func() bool {
				return src.reconciles() >= 2
			})
			second.start(t)
			// A sampling cycle applied by the new monitor (it reads the
			// GPU's reset request again), then a whole reconcile begun
			// after it.
			second.awaitResetRequested(t)
			base := src.reconciles()
			testutil.WaitForWithin(t, 30*time.Second, "a reconcile after the new monitor's sampling cycle", func() bool {
				return src.reconciles() >= base+2
			})
			updates := rec.stop(t, getNode(t, c.Client, tc.node).ResourceVersion)
			writes, _, summary := counter.counts()

			var untainted []string
			for _, n := range updates {
				if !tainted(n) {
					untainted = append(untainted, fmt.Sprintf("rv %s taints %v", n.ResourceVersion, n.Spec.Taints))
				}
			}
			t.Logf("restart (state dir %t): %d node updates recorded, %d without our taint; the new tainter's requests: %s",
				tc.persist, len(updates), len(untainted), summary)
			if tc.persist {
				if len(untainted) > 0 {
					t.Errorf("the taint left the node during the restart: %d of %d updates lack it: %v", len(untainted), len(updates), untainted)
				}
				if n := getNode(t, c.Client, tc.node); !tainted(n) {
					t.Errorf("not tainted after the restart: taints %v", n.Spec.Taints)
				}
				if writes != 0 {
					t.Logf("note: the restarted tainter wrote %d times although nothing changed", writes)
				}
			} else {
				if len(untainted) == 0 {
					t.Errorf("without a state dir the restart left the taint on all %d updates: the negative control shows nothing", len(updates))
				}
				// The sampler reads the reset request again: the taint comes back.
				testutil.WaitForWithin(t, 30*time.Second, "the taint back once the new monitor has sampled the GPU", func() bool {
					return tainted(getNode(t, c.Client, tc.node))
				})
			}

			// Still held: only a reset ends it.
			second.heldThenReset(t, gpuIndex, recovery)
			testutil.WaitForWithin(t, 30*time.Second+recovery, "the taint removed after the GPU reset", func() bool {
				n := getNode(t, c.Client, tc.node)
				return !tainted(n) && conditionIs(n, corev1.ConditionTrue)
			})
		})
	}
}

// nodeRecorder records every update of one Node from a resourceVersion on.
// client-go's RetryWatcher resumes from the last resourceVersion it saw
// when the API server ends a watch, so no update is missed.
type nodeRecorder struct {
	rw   *watchtools.RetryWatcher
	done chan struct{}

	mu      sync.Mutex
	updates []*corev1.Node
	lastRV  string
	errs    []string
}

// recordNode starts recording the updates of Node name after
// resourceVersion rv.
func recordNode(t testing.TB, c kubernetes.Interface, name, rv string) *nodeRecorder {
	t.Helper()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = sel
		return c.CoreV1().Nodes().Watch(ctx, o)
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(context.Background(), rv, lw)
	if err != nil {
		t.Fatalf("watch node %s from resourceVersion %s: %v", name, rv, err)
	}
	r := &nodeRecorder{rw: rw, done: make(chan struct{}), lastRV: rv}
	go func() {
		defer close(r.done)
		for ev := range rw.ResultChan() {
			r.mu.Lock()
			switch n, ok := ev.Object.(*corev1.Node); {
			case ev.Type == watch.Bookmark:
			case ok:
				r.updates = append(r.updates, n)
				r.lastRV = n.ResourceVersion
			default:
				r.errs = append(r.errs, fmt.Sprintf("%s event: %v", ev.Type, ev.Object))
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() { rw.Stop(); <-r.done })
	return r
}

// stop waits until the recorder has seen the Node at resourceVersion
// upTo (its current one), stops it and returns the updates recorded.
func (r *nodeRecorder) stop(t testing.TB, upTo string) []*corev1.Node {
	t.Helper()
	testutil.WaitForWithin(t, 30*time.Second, "the node watch to reach resourceVersion "+upTo, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.lastRV == upTo || len(r.errs) > 0
	})
	r.rw.Stop()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) > 0 {
		t.Fatalf("node watch failed, updates may be missing: %v", r.errs)
	}
	return r.updates
}

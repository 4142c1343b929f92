package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// fakeResource is a plugin.Resource with a fixed name and device count.
type fakeResource struct {
	name string
	n    int
}

func (f fakeResource) Name() string { return f.name }
func (f fakeResource) Devices() []plugin.Device {
	return make([]plugin.Device, f.n)
}
func (f fakeResource) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// syncRecorder records every Sync as resource names.
type syncRecorder struct {
	mu    sync.Mutex
	syncs [][]string
	ch    chan struct{}
}

func newSyncRecorder() *syncRecorder { return &syncRecorder{ch: make(chan struct{}, 16)} }

func (s *syncRecorder) sync(rs []plugin.Resource) {
	names := []string{}
	for _, r := range rs {
		names = append(names, r.Name())
	}
	s.mu.Lock()
	s.syncs = append(s.syncs, names)
	s.mu.Unlock()
	s.ch <- struct{}{}
}

func TestReconcileSourcesFailIndependently(t *testing.T) {
	discoverErr := errors.New("nvml unavailable")
	tests := []struct {
		name        string
		discoverErr error
		gpuErr      error
		want        []string
		wantErrs    []string
	}{
		{name: "all good", want: []string{"nvidia.com/gpu", "rdma/ib"}},
		{name: "gpu source refuses: rdma still served", gpuErr: errors.New("mig-strategy single: ..."), want: []string{"rdma/ib"}, wantErrs: []string{"gpu"}},
		{name: "discovery fails: sources get nil and serve what they can", discoverErr: discoverErr, want: []string{"rdma/ib"}, wantErrs: []string{"discovery"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := newSyncRecorder()
			var reported state
			r := &reconciler{
				log: slog.New(slog.DiscardHandler),
				discover: func() (*topology.Node, error) {
					if tc.discoverErr != nil {
						return nil, tc.discoverErr
					}
					return &topology.Node{}, nil
				},
				sources: []source{
					{name: "gpu", build: func(n *topology.Node) ([]plugin.Resource, error) {
						if n == nil {
							return nil, nil
						}
						if tc.gpuErr != nil {
							return nil, tc.gpuErr
						}
						return []plugin.Resource{fakeResource{"nvidia.com/gpu", 8}}, nil
					}},
					{name: "rdma", build: func(*topology.Node) ([]plugin.Resource, error) {
						return []plugin.Resource{fakeResource{"rdma/ib", 2}}, nil
					}},
				},
				sync:   rec.sync,
				report: func(st state) { reported = st },
			}
			var told []*topology.Node
			r.onDiscover = []func(*topology.Node){func(n *topology.Node) { told = append(told, n) }}
			r.reconcile()
			if wantTold := tc.discoverErr == nil; (len(told) == 1) != wantTold {
				t.Errorf("onDiscover called %d times, want it called: %v", len(told), wantTold)
			}
			if got := strings.Join(rec.syncs[0], ","); got != strings.Join(tc.want, ",") {
				t.Errorf("synced %s, want %s", got, strings.Join(tc.want, ","))
			}
			if len(reported.errs) != len(tc.wantErrs) {
				t.Errorf("reported errors %v, want for %v", reported.errs, tc.wantErrs)
			}
			for _, name := range tc.wantErrs {
				if reported.errs[name] == nil {
					t.Errorf("no error reported for %s", name)
				}
			}
		})
	}
}

// TestReconcileKeepsLastNodeWhenDiscoveryFails: once devices were seen, a
// failing rediscovery (NVML broken at run time) keeps them served from the
// last good node, so they can be reported Unhealthy instead of vanishing;
// onDiscover is not told the stale node again.
func TestReconcileKeepsLastNodeWhenDiscoveryFails(t *testing.T) {
	rec := newSyncRecorder()
	good := &topology.Node{GPUs: []topology.GPU{{Index: 0, UUID: "GPU-0"}}}
	var fail bool
	var built []*topology.Node
	var reported state
	told := 0
	r := &reconciler{
		log: slog.New(slog.DiscardHandler),
		discover: func() (*topology.Node, error) {
			if fail {
				return nil, errors.New("nvml: unknown error")
			}
			return good, nil
		},
		onDiscover: []func(*topology.Node){func(*topology.Node) { told++ }},
		sources: []source{{name: "gpu", build: func(n *topology.Node) ([]plugin.Resource, error) {
			built = append(built, n)
			if n == nil {
				return nil, nil
			}
			return []plugin.Resource{fakeResource{"nvidia.com/gpu", len(n.GPUs)}}, nil
		}}},
		sync:   rec.sync,
		report: func(st state) { reported = st },
	}
	r.reconcile()
	fail = true
	r.reconcile()
	r.reconcile()
	if len(built) != 3 || built[1] != good || built[2] != good {
		t.Fatalf("sources built from %v, want the good node every pass", built)
	}
	if told != 1 {
		t.Errorf("onDiscover told %d times, want 1 (only the real discovery)", told)
	}
	if got := strings.Join(rec.syncs[2], ","); got != "nvidia.com/gpu" {
		t.Errorf("synced %q after failed discovery, want nvidia.com/gpu still served", got)
	}
	if reported.errs["discovery"] == nil || reported.node != good {
		t.Errorf("reported state %+v, want the discovery error and the last good node", reported)
	}
}

// TestReconcileSignals: a rediscover signal runs discovery again, a resync
// signal only re-syncs the last resources.
func TestReconcileSignals(t *testing.T) {
	rec := newSyncRecorder()
	var mu sync.Mutex
	discoveries := 0
	rediscover := make(chan struct{})
	resync := make(chan struct{})
	r := &reconciler{
		log: slog.New(slog.DiscardHandler),
		discover: func() (*topology.Node, error) {
			mu.Lock()
			defer mu.Unlock()
			discoveries++
			return &topology.Node{}, nil
		},
		sources: []source{{name: "gpu", build: func(*topology.Node) ([]plugin.Resource, error) {
			return []plugin.Resource{fakeResource{"nvidia.com/gpu", 1}}, nil
		}}},
		sync:       rec.sync,
		rediscover: []<-chan struct{}{rediscover, nil},
		resync:     []<-chan struct{}{resync},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx); close(done) }()

	<-rec.ch // initial pass
	resync <- struct{}{}
	<-rec.ch
	mu.Lock()
	if discoveries != 1 {
		t.Errorf("after a resync signal: %d discoveries, want 1", discoveries)
	}
	mu.Unlock()
	rediscover <- struct{}{}
	<-rec.ch
	mu.Lock()
	if discoveries != 2 {
		t.Errorf("after a rediscover signal: %d discoveries, want 2", discoveries)
	}
	mu.Unlock()
	cancel()
	<-done
	if len(rec.syncs) != 3 {
		t.Errorf("%d syncs, want 3", len(rec.syncs))
	}
}

// awaitSignal waits for one signal on ch, failing the test with what after a
// bound that only a broken reconciler reaches.
func awaitSignal(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestReconcileResyncDuringDiscovery: a discovery blocked in NVML does not
// hold up health re-syncs; rediscover requests during it coalesce into one
// more discovery afterwards, and two discoveries never run at once.
func TestReconcileResyncDuringDiscovery(t *testing.T) {
	rec := newSyncRecorder()
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	var calls, running, overlap atomic.Int32
	rediscover := make(chan struct{})
	resync := make(chan struct{})
	r := &reconciler{
		log: slog.New(slog.DiscardHandler),
		discover: func() (*topology.Node, error) {
			if running.Add(1) > 1 {
				overlap.Add(1)
			}
			defer running.Add(-1)
			if calls.Add(1) == 2 {
				// The second discovery hangs, as on a GPU in a GSP timeout.
				started <- struct{}{}
				<-release
			}
			return &topology.Node{}, nil
		},
		sources: []source{{name: "gpu", build: func(*topology.Node) ([]plugin.Resource, error) {
			return []plugin.Resource{fakeResource{"nvidia.com/gpu", 1}}, nil
		}}},
		sync:       rec.sync,
		rediscover: []<-chan struct{}{rediscover},
		resync:     []<-chan struct{}{resync},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	awaitSignal(t, rec.ch, "the first discovery's sync")
	rediscover <- struct{}{}
	awaitSignal(t, started, "the second discovery to start")
	resync <- struct{}{}
	awaitSignal(t, rec.ch, "a health re-sync's sync while a discovery is blocked")
	// Two more requests while it is blocked: one discovery after it.
	rediscover <- struct{}{}
	rediscover <- struct{}{}
	resync <- struct{}{}
	awaitSignal(t, rec.ch, "a second health re-sync's sync while a discovery is blocked")
	close(release)
	awaitSignal(t, rec.ch, "the blocked discovery's sync")
	awaitSignal(t, rec.ch, "the coalesced discovery's sync")
	cancel()
	<-done
	if n := calls.Load(); n != 3 {
		t.Errorf("%d discoveries, want 3 (initial, the blocked one, one for the requests during it)", n)
	}
	if n := overlap.Load(); n != 0 {
		t.Errorf("%d discoveries started while another ran", n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.syncs) != 5 {
		t.Errorf("%d syncs, want 5", len(rec.syncs))
	}
}

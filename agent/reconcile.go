package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/signals"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// source turns the discovered node into some of the served resources (GPU
// resources today; RDMA resources plug in the same way). node is nil when
// discovery failed. A source's error drops only its own resources.
type source struct {
	name  string
	build func(node *topology.Node) ([]plugin.Resource, error)
}

// reconciler keeps the served resources in step with the hardware: it
// rediscovers on a change signal, a rescan tick or a request (SIGHUP), and
// re-syncs without rediscovering when only health changed, also while a
// discovery is running.
type reconciler struct {
	log      *slog.Logger
	discover func() (*topology.Node, error)
	// onDiscover is told every successfully discovered node before the
	// sources build from it (e.g. the health monitor's SetNode).
	onDiscover []func(*topology.Node)
	sources    []source
	// sync hands the full resource list to the plugin manager.
	sync func([]plugin.Resource)
	// filter, if set, picks the resources the device plugin serves (the
	// kinds DRA does not); it is applied to every pass and re-sync.
	filter func([]plugin.Resource) []plugin.Resource
	// publish, if set, is told every applied state after sync (DRA).
	publish func(state)
	// report, if set, is told every applied state (the inventory printer).
	report func(state)
	rescan time.Duration
	// rediscover and resync are the change signals: layout changes (the
	// simulator, SIGHUP) and health changes respectively.
	rediscover []<-chan struct{}
	resync     []<-chan struct{}

	// last is the state of the last full pass, re-applied on health changes.
	last state
	// good is the last successfully discovered node and lastErr the last
	// discovery error (logged at error level only when it changes).
	good    *topology.Node
	lastErr string

	// shown is the last applied state as served (filtered), for readers
	// on other goroutines.
	mu    sync.Mutex
	shown state
}

// state is what the reconciler serves after one pass.
type state struct {
	// node is the node served from: the one just discovered, or the last
	// good one when discovery failed (nil if there never was one).
	node      *topology.Node
	resources []plugin.Resource
	// errs are the failures of this pass, by source ("discovery" too).
	errs map[string]error
}

// run starts a discovery at once, then one per rediscover signal or tick,
// until ctx is done. Discovery runs on its own goroutine: NVML calls can
// block for tens of seconds on a hung GPU, and health re-syncs (which carry
// every other GPU's health to the kubelet) must not wait for them. Its
// result is applied here, on the run goroutine, so onDiscover, the sources
// and sync are never called concurrently. One discovery runs at a time; any
// number of requests while it runs add one more discovery after it.
func (r *reconciler) run(ctx context.Context) {
	full := signals.FanIn(ctx, r.rediscover...)
	light := signals.FanIn(ctx, r.resync...)
	var tick <-chan time.Time
	if r.rescan > 0 {
		t := time.NewTicker(r.rescan)
		defer t.Stop()
		tick = t.C
	}
	// done has room for the one running discovery's result, so a discovery
	// finishing after ctx is done does not leak its goroutine.
	done := make(chan discovered, 1)
	running, pending, applied := false, false, false
	start := func() {
		running = true
		go func() {
			node, err := r.discover()
			done <- discovered{node, err}
		}()
	}
	request := func() {
		if running {
			pending = true
			return
		}
		start()
	}
	start()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full:
			request()
		case <-tick:
			request()
		case <-light:
			// Before the first pass there is nothing to re-sync.
			if applied {
				r.apply(r.last)
			}
		case d := <-done:
			running = false
			r.finish(d.node, d.err)
			applied = true
			if pending {
				pending = false
				start()
			}
		}
	}
}

// discovered is one discovery's result.
type discovered struct {
	node *topology.Node
	err  error
}

// reconcile rediscovers the node and rebuilds every source's resources, on
// the calling goroutine (tests and one-shot use; run discovers off it).
func (r *reconciler) reconcile() {
	node, err := r.discover()
	r.finish(node, err)
}

// finish applies one discovery's result: onDiscover, every source, sync.
func (r *reconciler) finish(node *topology.Node, err error) {
	st := state{errs: map[string]error{}}
	if err != nil {
		if err.Error() != r.lastErr {
			r.log.Error("device discovery failed; serving the last discovered devices", "err", err, "devices", r.good != nil)
		} else {
			r.log.Debug("device discovery still failing", "err", err)
		}
		r.lastErr = err.Error()
		st.errs["discovery"] = err
		// Keep serving the devices last seen: the health monitor sees the
		// same NVML failure and marks them Unhealthy. Withdrawing them
		// instead would drop the kubelet's capacity to zero and stop its
		// ListAndWatch streams, hiding the fault rather than reporting it.
		node = r.good
	} else {
		if r.lastErr != "" {
			r.log.Info("device discovery works again")
			r.lastErr = ""
		}
		r.good = node
		for _, f := range r.onDiscover {
			f(node)
		}
	}
	st.node = node
	for _, s := range r.sources {
		rs, err := s.build(node)
		if err != nil {
			// Serving nothing for this source beats serving resources that
			// contradict the configuration (e.g. MIG single on a mixed node).
			r.log.Error("resources not served", "source", s.name, "err", err)
			st.errs[s.name] = err
			continue
		}
		st.resources = append(st.resources, rs...)
	}
	r.apply(st)
}

func (r *reconciler) apply(st state) {
	r.last = st
	if r.filter != nil {
		st.resources = r.filter(st.resources)
	}
	r.mu.Lock()
	r.shown = st
	r.mu.Unlock()
	r.sync(st.resources)
	if r.publish != nil {
		r.publish(st)
	}
	if r.report != nil {
		r.report(st)
	}
}

// current is the last applied state (empty before the first pass).
func (r *reconciler) current() state {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shown
}

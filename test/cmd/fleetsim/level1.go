package main

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// fakeHealth is a node's fitness, flipped by the simulation.
type fakeHealth struct {
	mu   sync.Mutex
	f    health.Fitness
	subs []chan struct{}
}

// Fitness implements kubeapi.Health.
func (h *fakeHealth) Fitness() health.Fitness {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.f
}

// Subscribe implements kubeapi.Health.
func (h *fakeHealth) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.subs = append(h.subs, ch)
	h.mu.Unlock()
	return ch
}

func (h *fakeHealth) set(f health.Fitness) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.f = f
	for _, ch := range h.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

var (
	fit   = health.Fitness{Fit: true}
	unfit = health.Fitness{Reason: "gpu-lost", Message: "GPU-0: gpu lost (fleetsim)", Devices: []string{"GPU-0"}}
)

// simAgent is one node agent's API side: its own clients and transport,
// NodeWatch, Tainter and fitness.
type simAgent struct {
	name   string
	ctr    *apicount.Counter
	health *fakeHealth
	reg    *prometheus.Registry
}

// refused reads the agent's gpu_node_agent_taint_refused gauge.
func (a *simAgent) refused() bool {
	mfs, err := a.reg.Gather()
	if err != nil {
		return false
	}
	for _, mf := range mfs {
		if mf.GetName() == "gpu_node_agent_taint_refused" {
			for _, m := range mf.GetMetric() {
				if m.GetGauge().GetValue() == 1 {
					return true
				}
			}
		}
	}
	return false
}

// steadyResult is the steady-state measurement.
type steadyResult struct {
	window        time.Duration
	agents, api   apicount.Snapshot
	nodes         int
	watchesOpened int
}

// phaseResult is one fault or recovery wave.
type phaseResult struct {
	faulted, limit int
	// tainted is the fleet's tainted count at the end, max the most seen.
	tainted, max, refused int
	// toLimit is from the flip to the count reaching the limit (fault)
	// or zero (recovery); -1 when never reached.
	toLimit time.Duration
	// untainted is from the flip to no taint left (recovery).
	untainted time.Duration
	// settled is from the flip to the end state (every condition
	// updated; on recovery also every slot Lease released).
	settled     time.Duration
	complete    bool
	agents, api apicount.Snapshot
	leasesLeft  int
	// recovered says how the faults were cleared (level 2).
	recovered string
}

type level1Result struct {
	nodes, limit int
	// identity is what the agents authenticate as (-identity), user its
	// user name; leaseNS and eventNS are where their slot Leases and
	// Events go; setupTime is how long creating the Pods and tokens took
	// (before and outside every measured window).
	identity, user   string
	leaseNS, eventNS string
	setupTime        time.Duration
	startup          apicount.Snapshot
	startupTime      time.Duration
	steady           steadyResult
	waves            [][2]phaseResult
	// total is every agent request of the run, from start-up on.
	total     apicount.Snapshot
	violation bool
	// watchLeaks are the waves after which more slot Lease watches were
	// open than refused nodes (fault) or any at all (recovery).
	watchLeaks []string
}

const (
	fleetLabel = "fleetsim.gpu-node-agent.io/fleet"
	l1NS       = "fleetsim-l1"
)

// runLevel1 runs n simulated agents' API side in this process.
func runLevel1(ctx context.Context, c *cluster.Cluster, o options) (*level1Result, error) {
	admin, err := adminClient(c)
	if err != nil {
		return nil, err
	}
	names := make([]string, o.nodes)
	for i := range names {
		names[i] = fmt.Sprintf("l1-node-%04d", i)
	}
	start := time.Now()
	if err := createNodes(ctx, admin, names, "l1"); err != nil {
		return nil, err
	}
	logf("level 1: %d Nodes created in %s", o.nodes, time.Since(start).Round(time.Millisecond))
	res := &level1Result{nodes: o.nodes, limit: safeguard.Limit(o.nodes, o.maxFraction), identity: o.identity}
	// agentREST is node i's rest.Config.
	var agentREST func(i int, ctr *apicount.Counter) *rest.Config
	switch o.identity {
	case identityToken:
		start = time.Now()
		id, err := applyChartIdentity(ctx, admin, filepath.Join(cluster.RepoRoot(), "deploy", "manifests"))
		if err != nil {
			return nil, err
		}
		tokens, err := id.issueTokens(ctx, admin, names, tokenExpiry(o))
		if err != nil {
			return nil, err
		}
		if err := id.waitInEffect(ctx, c.RESTConfig, tokens[0], names[0], time.Minute); err != nil {
			return nil, err
		}
		res.user, res.leaseNS, res.eventNS, res.setupTime = id.username(), id.leaseNS, id.eventNS, time.Since(start)
		logf("level 1: %d agent Pods and bound tokens created, %s's RBAC and policy in effect, in %s",
			o.nodes, id.policy, res.setupTime.Round(time.Millisecond))
		agentREST = func(i int, ctr *apicount.Counter) *rest.Config {
			return tokenConfig(c.RESTConfig, tokens[i], "fleetsim/"+names[i], ctr)
		}
	case identityCert:
		if err := createNamespace(ctx, admin, l1NS); err != nil {
			return nil, err
		}
		res.user, res.leaseNS, res.eventNS = "admin (client certificate)", l1NS, ""
		agentREST = func(i int, ctr *apicount.Counter) *rest.Config {
			return agentConfig(c.RESTConfig, "fleetsim/"+names[i], ctr)
		}
	default:
		return nil, fmt.Errorf("-identity %q: must be %s or %s", o.identity, identityToken, identityCert)
	}
	obs, err := startObserver(ctx, admin, fleetLabel+"=l1", res.leaseNS)
	if err != nil {
		return nil, err
	}

	// No node selector, as the chart's default: the fleet is every Node of
	// the cluster, which holds only level 1's Nodes while level 1 runs
	// (level 2 creates its own after), and the agents learn its size from
	// remainingItemCount (safeguard.Slots.measure).
	cfg := kubeapi.TaintConfig{MaxFraction: o.maxFraction, LeaseNamespace: res.leaseNS,
		EventNamespace: res.eventNS, Resync: o.resync}
	res.eventNS = cfg.WithDefaults().EventNamespace
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := slog.New(slog.NewTextHandler(logSink(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	agents := make([]*simAgent, o.nodes)
	watches := make([]*kubeapi.NodeWatch, o.nodes)
	tainters := make([]*kubeapi.Tainter, o.nodes)
	// The agents stop when runLevel1 returns.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	start = time.Now()
	for i, name := range names {
		a := &simAgent{name: name, ctr: apicount.New(), health: &fakeHealth{f: fit}, reg: prometheus.NewRegistry()}
		clients, err := kubeapi.ClientsForConfig(agentREST(i, a.ctr))
		if err != nil {
			return nil, err
		}
		w, err := kubeapi.NewNodeWatch(clients.Core, name, cfg.WithDefaults().Resync)
		if err != nil {
			return nil, err
		}
		t, err := kubeapi.NewTainter(clients, w, cfg, log.With("node", name), a.reg)
		if err != nil {
			return nil, err
		}
		agents[i], watches[i], tainters[i] = a, w, t
		wg.Go(func() { w.Run(ctx) })
	}
	for _, w := range watches {
		if err := w.WaitSynced(ctx); err != nil {
			return nil, err
		}
	}
	logf("level 1: %d node informers synced in %s", o.nodes, time.Since(start).Round(time.Millisecond))
	for i, t := range tainters {
		h := agents[i].health
		wg.Go(func() { _ = t.Run(ctx, h) })
	}
	ctrs := make([]*apicount.Counter, o.nodes)
	for i, a := range agents {
		ctrs[i] = a.ctr
	}
	if _, ok := obs.wait(ctx, 5*time.Minute, func(st *state) bool { return st.condIs(names, corev1.ConditionTrue) }); !ok {
		t := apicount.Sum(ctrs)
		return nil, fmt.Errorf("level 1: not every Node got condition %s=True at start (refused requests: %s; %q)",
			conditionType, t.DescribeDenied(), t.Samples)
	}
	waitQuiet(ctx, ctrs, startupQuiet)
	res.startup, res.startupTime = apicount.Sum(ctrs), time.Since(start)
	// Whatever happens next, the run's refusals are reported.
	defer func() { res.total = apicount.Sum(ctrs) }()
	logf("level 1: every agent started (condition True on every Node) in %s", res.startupTime.Round(time.Millisecond))

	// Steady state.
	logf("level 1: measuring steady state for %s", o.steady)
	agentsBefore := apicount.Sum(ctrs)
	apiBefore, err := apiserverRequests(ctx, admin)
	if err != nil {
		return res, err
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(o.steady):
	}
	agentsAfter := apicount.Sum(ctrs)
	apiAfter, err := apiserverRequests(ctx, admin)
	if err != nil {
		return res, err
	}
	d := agentsAfter.Minus(agentsBefore)
	res.steady = steadyResult{window: o.steady, agents: d, api: apiAfter.Minus(apiBefore).Without("WATCH"), nodes: o.nodes,
		watchesOpened: d.Prefixed("WATCH")}

	faulting := int(float64(o.nodes)*o.faultFraction + 0.5)
	for rep := range o.reps {
		idx := rand.Perm(o.nodes)[:faulting]
		faulted := make([]*simAgent, len(idx))
		fnames := make([]string, len(idx))
		for i, j := range idx {
			faulted[i], fnames[i] = agents[j], names[j]
		}
		f, err := faultWave(ctx, admin, obs, ctrs, faulted, fnames, res.limit, o.settle)
		if err != nil {
			return res, err
		}
		logf("level 1 rep %d fault: %d faulted, %d tainted (max %d, limit %d), %d refused, to limit %s, %d requests, %d denied, %.1f KiB received per faulting node, %d lease watches open",
			rep+1, f.faulted, f.tainted, f.max, f.limit, f.refused, fmtDur(f.toLimit), f.agents.Requests(), f.agents.DeniedTotal(),
			float64(f.agents.Bytes+f.agents.WatchBytes)/1024/float64(f.faulted), f.agents.Open["WATCH leases"])
		if f.max > res.limit {
			res.violation = true
		}
		if n := f.agents.Open["WATCH leases"]; n > int64(f.refused) {
			res.watchLeaks = append(res.watchLeaks, fmt.Sprintf("rep %d: %d slot Lease watches open after the fault, more than the %d refused nodes", rep+1, n, f.refused))
		}
		r, err := recoveryWave(ctx, admin, obs, ctrs, faulted, fnames, o.settle)
		if err != nil {
			return res, err
		}
		logf("level 1 rep %d recovery: untainted in %s, settled in %s, %d requests, %d leases left, %d denied, %d lease watches open",
			rep+1, fmtDur(r.untainted), fmtDur(r.settled), r.agents.Requests(), r.leasesLeft, r.agents.DeniedTotal(), r.agents.Open["WATCH leases"])
		if n := r.agents.Open["WATCH leases"]; n > 0 {
			res.watchLeaks = append(res.watchLeaks, fmt.Sprintf("rep %d: %d slot Lease watches still open after the recovery", rep+1, n))
		}
		res.waves = append(res.waves, [2]phaseResult{f, r})
	}
	return res, nil
}

// faultWave flips the agents unfit at once and waits until every one has
// its condition False and the limit (or every faulted node) is tainted.
func faultWave(ctx context.Context, admin kubernetes.Interface, obs *observer, ctrs []*apicount.Counter, faulted []*simAgent,
	names []string, limit int, timeout time.Duration) (phaseResult, error) {
	want := min(limit, len(faulted))
	obs.phase(want)
	agentsBefore := apicount.Sum(ctrs)
	apiBefore, err := apiserverRequests(ctx, admin)
	if err != nil {
		return phaseResult{}, err
	}
	t0 := time.Now()
	for _, a := range faulted {
		a.health.set(unfit)
	}
	_, complete := obs.wait(ctx, timeout, func(st *state) bool {
		return st.condIs(names, corev1.ConditionFalse) && len(st.tainted) >= want
	})
	settled := time.Since(t0)
	waitQuiet(ctx, ctrs, waveQuiet)
	st := obs.snapshot()
	r := phaseResult{faulted: len(faulted), limit: limit, tainted: len(st.tainted), max: st.max, toLimit: -1,
		settled: settled, complete: complete, leasesLeft: len(st.leases)}
	if !st.reached.IsZero() {
		r.toLimit = st.reached.Sub(t0)
	}
	for _, a := range faulted {
		if a.refused() {
			r.refused++
		}
	}
	r.agents = apicount.Sum(ctrs).Minus(agentsBefore)
	apiAfter, err := apiserverRequests(ctx, admin)
	if err != nil {
		return phaseResult{}, err
	}
	r.api = apiAfter.Minus(apiBefore).Without("WATCH")
	return r, nil
}

// recoveryWave flips the faulted agents fit at once and waits until no
// Node is tainted, no slot Lease is left and every condition is True.
func recoveryWave(ctx context.Context, admin kubernetes.Interface, obs *observer, ctrs []*apicount.Counter, faulted []*simAgent,
	names []string, timeout time.Duration) (phaseResult, error) {
	obs.phase(0)
	agentsBefore := apicount.Sum(ctrs)
	apiBefore, err := apiserverRequests(ctx, admin)
	if err != nil {
		return phaseResult{}, err
	}
	t0 := time.Now()
	for _, a := range faulted {
		a.health.set(fit)
	}
	r, err := awaitRecovery(ctx, obs, names, t0, timeout)
	if err != nil {
		return r, err
	}
	waitQuiet(ctx, ctrs, waveQuiet)
	r.agents = apicount.Sum(ctrs).Minus(agentsBefore)
	apiAfter, err := apiserverRequests(ctx, admin)
	if err != nil {
		return phaseResult{}, err
	}
	r.api = apiAfter.Minus(apiBefore).Without("WATCH")
	return r, nil
}

// awaitRecovery waits for no taint, then for no slot Lease and every
// named node's condition True.
func awaitRecovery(ctx context.Context, obs *observer, names []string, t0 time.Time, timeout time.Duration) (phaseResult, error) {
	r := phaseResult{faulted: len(names), untainted: -1, settled: -1, toLimit: -1}
	deadline := t0.Add(timeout)
	if _, ok := obs.wait(ctx, time.Until(deadline), func(st *state) bool { return len(st.tainted) == 0 }); ok {
		r.untainted = time.Since(t0)
	}
	st, ok := obs.wait(ctx, time.Until(deadline), func(st *state) bool {
		return len(st.tainted) == 0 && len(st.leases) == 0 && st.condIs(names, corev1.ConditionTrue)
	})
	if ok {
		r.settled = time.Since(t0)
	}
	r.complete = ok
	r.tainted, r.max, r.leasesLeft = len(st.tainted), st.max, len(st.leases)
	return r, ctx.Err()
}

// Quiet periods of waitQuiet: at start-up, and after a wave, longer than
// the 4-8 s after which a refused node first asks again on its own
// (safeguard's askAgainLater), so that a wave's requests are counted in
// that wave. Its later own asks, 8-64 s apart, come only while the
// full-bucket hint leaves buckets it did not read open; any that come
// after the quiet period are counted in the recovery that follows.
const (
	startupQuiet = 2 * time.Second
	waveQuiet    = 10 * time.Second
)

// waitQuiet waits until the agents have made no request (watches aside)
// for quiet, at most two minutes.
func waitQuiet(ctx context.Context, ctrs []*apicount.Counter, quiet time.Duration) {
	last, since := apicount.Sum(ctrs).Requests(), time.Now()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(250 * time.Millisecond)
		n := apicount.Sum(ctrs).Requests()
		if n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= quiet {
			return
		}
	}
}

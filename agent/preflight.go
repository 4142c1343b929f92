package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// RunPreflight runs every preflight item once on hw (the preflight
// subcommand): a discovery now, the PCI bus, the RDMA devices of
// cfg.RDMA's resources, DCGM's diagnostic unless hw is simulated, and
// cfg.Preflight's command. hw stays open.
func RunPreflight(ctx context.Context, cfg Config, hw Hardware, log *slog.Logger) *preflight.Report {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in, done := preflightInputs(hw, cfg, nil, log)
	defer done()
	return preflight.New(cfg.Preflight, log).Run(ctx, in)
}

// preflightInputs gathers what a full preflight reads, now: a discovery,
// the PCI bus, the RDMA devices (a discovery of their own: port states
// change), DCGM (opened for the run; a simulated node has none: the host's
// DCGM would test the host's GPUs) and the expected GPU count from the
// node's labels. done releases what it opened.
func preflightInputs(hw Hardware, cfg Config, labels map[string]string, log *slog.Logger) (in preflight.Inputs, done func()) {
	var closers []func()
	done = func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	hostRoot := hw.HostRoot()
	in.RDMAResources = cfg.RDMA.Resources
	in.Node, in.NodeErr = hw.Discover()
	if in.Node != nil {
		in.Owner = hw.Owner()
	}
	in.BusGPUs, in.BusErr = health.GPUsOnPCI(hostRoot)
	in.ExpectedGPUs, in.ExpectedGPUsErr = preflight.ExpectedGPUsFromLabels(cfg.Preflight, labels)
	if len(cfg.RDMA.Resources) > 0 {
		nics := rdma.OpenNICs(cfg.RDMA, rdma.NICsOptions{Root: hostRoot, Simulated: simulated(hw), Logger: log})
		closers = append(closers, nics.Close)
		in.RDMADevices, in.RDMAErr = nics.Devices(), nics.Err()
	}
	if w, ok := hw.(CommandWrapper); ok {
		in.WrapCommand = w.WrapPreflightCommand
	}
	switch {
	case simulated(hw):
		in.DCGMErr = errors.New("a simulated node has no DCGM")
	case !slices.Contains(cfg.Preflight.DisabledItems, preflight.ItemDCGM):
		hcfg := cfg.Health
		hcfg.HostRoot = hostRoot
		d, err := health.OpenDCGMDiag(hcfg, log)
		if err != nil {
			in.DCGMErr = err
			break
		}
		closers = append(closers, d.Close)
		in.DCGM = d
	}
	return in, done
}

// newPreflighter builds the preflight's runner and metrics, or nil when
// the preflight neither gates the node nor re-checks GPUs. Call it after
// the node object and the usage tracker exist.
func (a *Agent) newPreflighter() (*preflighter, error) {
	pf := a.cfg.Preflight
	if !pf.Enabled && pf.RecheckInterval <= 0 {
		return nil, nil
	}
	m, err := preflight.NewMetrics(a.reg)
	if err != nil {
		return nil, fmt.Errorf("preflight metrics: %w", err)
	}
	p := &preflighter{
		cfg: a.cfg, hw: a.hw, metrics: m,
		checker:     preflight.New(pf, a.log.With("component", "preflight")),
		observe:     a.mon.Observe,
		node:        func() *topology.Node { return a.rec.current().node },
		assignments: a.tracker.Assignments,
		cycled:      a.tracker.Subscribe(),
		recordRetry: recordRetry,
		log:         a.log.With("component", "preflight"),
	}
	if pf.Enabled {
		if a.node == nil {
			return nil, errors.New("preflight.enabled: the node gate needs the node name")
		}
		p.gate = a.node
	}
	return p, nil
}

// preflightGateConfig is the node object's preflight gate: none unless
// preflight.enabled; a dry run with the taint's. Unless
// preflight.keepAcrossReboots, a pass counts for the boot it was made in:
// the gate is given the host's boot time.
func (a *Agent) preflightGateConfig() *kubeapi.PreflightGateConfig {
	if !a.cfg.Preflight.Enabled {
		return nil
	}
	taint := a.cfg.Taint.WithDefaults()
	cfg := &kubeapi.PreflightGateConfig{TaintKey: a.cfg.Preflight.TaintKey, ConditionType: a.cfg.Preflight.ConditionType,
		EventNamespace: taint.EventNamespace, DryRun: taint.Mode == kubeapi.TaintDryRun}
	if a.cfg.Preflight.KeepAcrossReboots {
		return cfg
	}
	boot, err := hostBootTime(a.hw.HostRoot())
	switch {
	case err == nil:
		cfg.BootTime = boot
	case simulated(a.hw):
		// A simulated root has a /proc/stat only if the test wrote one.
		a.log.Debug("no boot time under the simulated host root; a preflight pass is kept across reboots", "err", err)
	default:
		a.log.Warn("cannot read the host's boot time; a preflight pass is kept across reboots", "err", err)
	}
	return cfg
}

// hostBootTime is when the host booted: btime of /proc/stat under hostRoot
// (proc(5): "boot time, in seconds since the Epoch"), which a container
// reads as the host's (the file is not namespaced).
func hostBootTime(hostRoot string) (time.Time, error) {
	fs, err := procfs.NewFS(filepath.Join(hostRoot, "proc"))
	if err != nil {
		return time.Time{}, fmt.Errorf("host boot time: %w", err)
	}
	st, err := fs.Stat()
	if err != nil {
		return time.Time{}, fmt.Errorf("host boot time: %w", err)
	}
	if st.BootTime == 0 {
		return time.Time{}, fmt.Errorf("host boot time: no btime in %s", filepath.Join(hostRoot, "proc", "stat"))
	}
	return time.Unix(int64(st.BootTime), 0), nil
}

// preflightGate is the Node side of the gate: *kubeapi.NodeObject.
type preflightGate interface {
	PreflightRecord(ctx context.Context) (proven bool, labels map[string]string, err error)
	SetPreflight(v kubeapi.PreflightVerdict)
	// PreflightRerun is signalled by an operator's re-run request.
	PreflightRerun() <-chan struct{}
}

// preflighter runs the preflight in the agent: the gating run (full, until
// one passes, on a node never proven) and the periodic re-checks of idle
// GPUs. It runs on its own goroutine: a run blocks on NVML, DCGM and the
// command for minutes, and nothing served waits for it.
type preflighter struct {
	cfg     Config
	hw      Hardware
	checker *preflight.Checker
	metrics *preflight.Metrics
	// gate is nil unless preflight.enabled.
	gate preflightGate
	// observe takes the re-checks' findings (the health monitor).
	observe func(health.Observation)
	// node is the last discovered node and assignments the kubelet's
	// latest answer (nil: unknown); the re-checks read both.
	node        func() *topology.Node
	assignments func() *usage.Assignments
	// cycled is signalled after each of the usage tracker's cycles: the
	// gating run waits (briefly) for the first, so that it knows which
	// GPUs pods hold before it loads any.
	cycled <-chan struct{}
	// recordRetry spaces the reads of the Node's record that failed.
	recordRetry time.Duration
	log         *slog.Logger

	// last is the latest results: the last full run with the re-checks
	// since merged in (run goroutine only).
	last *preflight.Report
}

// run gates the node (when enabled), then re-checks idle GPUs every
// preflight.recheckInterval (when set) and gates the node again on an
// operator's re-run request, until ctx ends.
func (p *preflighter) run(ctx context.Context) {
	var rerun <-chan struct{}
	if p.gate != nil {
		if !p.gateNode(ctx, false) {
			return
		}
		rerun = p.gate.PreflightRerun()
	}
	var tick <-chan time.Time
	if every := time.Duration(p.cfg.Preflight.RecheckInterval); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	if tick == nil && rerun == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			p.recheck(ctx)
		case <-rerun:
			p.log.Info("preflight re-run requested on the node; running every item again")
			if !p.gateNode(ctx, true) {
				return
			}
		}
	}
}

// gateNode runs full preflights until one passes and hands each verdict
// to the gate, which untaints the node on the pass. A node the Node
// object shows proven (an earlier run passed) is not run again, unless
// forced (an operator's re-run request): its GPUs may be busy. A re-run
// request while it waits to retry a failed run retries at once. It
// returns false when ctx ended first.
func (p *preflighter) gateNode(ctx context.Context, force bool) bool {
	retry := time.Duration(p.cfg.Preflight.WithDefaults().RetryInterval)
	rerun := p.gate.PreflightRerun()
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-rerun:
			return true
		}
	}
	for {
		proven, labels, err := p.gate.PreflightRecord(ctx)
		if ctx.Err() != nil {
			return false
		}
		if err != nil {
			// The Node not there yet, or its informer not running: the
			// node stays as it is (tainted if registered so) and the
			// record is read again.
			p.log.Warn("cannot read the node's preflight record; trying again", "err", err, "retry", p.recordRetry)
			if !wait(p.recordRetry) {
				return false
			}
			continue
		}
		if proven && !force {
			p.log.Info("node already passed its preflight (condition on the Node); not gating it again")
			return true
		}
		p.waitForPods(ctx)
		rep := p.full(ctx, labels)
		if ctx.Err() != nil {
			return false
		}
		p.gate.SetPreflight(kubeapi.PreflightVerdict{Ran: true, Passed: rep.Passed(), Message: rep.Summary(kubeapi.MaxMessage)})
		if rep.Passed() {
			return true
		}
		p.log.Warn("node stays tainted: preflight failed; running it again later", "failed", len(rep.Failed()), "retry", retry)
		if !wait(retry) {
			return false
		}
	}
}

// recordRetry spaces the reads of a Node's preflight record that failed.
const recordRetry = 10 * time.Second

// firstAnswerWait bounds how long the gating run waits for the kubelet's
// first pod-resources answer: without one it runs as on a new node.
const firstAnswerWait = 30 * time.Second

// waitForPods waits, before the first gating run only, until the usage
// tracker has asked the kubelet once (or firstAnswerWait passed, or ctx
// ended).
func (p *preflighter) waitForPods(ctx context.Context) {
	if p.cycled == nil || p.assignments() != nil {
		return
	}
	defer func() { p.cycled = nil }()
	t := time.NewTimer(firstAnswerWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
		p.log.Warn("no pod-resources answer yet; the preflight runs as on a node no pod uses")
	case <-p.cycled:
	}
}

// full runs every item once and exports the results. The items that load
// the GPUs are skipped while pods hold any (preflight switched on for a
// node already in use).
func (p *preflighter) full(ctx context.Context, labels map[string]string) *preflight.Report {
	in, done := preflightInputs(p.hw, p.cfg, labels, p.log)
	defer done()
	if held := heldGPUs(in.Node, p.assignments()); len(held) > 0 {
		in.Busy = "pods hold " + strings.Join(held, ", ")
	}
	rep := p.checker.Run(ctx, in)
	p.last = rep
	p.metrics.Set(rep)
	return rep
}

// recheck runs the per-GPU items on the GPUs no pod holds (none while the
// kubelet's answer is unknown) and reports each result to the health
// monitor: a failed item is a fault of its GPU (check "preflight", key the
// item), a passed or skipped one clears it.
func (p *preflighter) recheck(ctx context.Context) {
	node, asg := p.node(), p.assignments()
	if node == nil || asg == nil {
		p.log.Debug("preflight re-check skipped: no discovered node or no pod-resources answer yet")
		return
	}
	var idle []string
	for _, g := range node.GPUs {
		if !holds(asg, g) {
			idle = append(idle, g.UUID)
		}
	}
	if len(idle) == 0 {
		return
	}
	rep := p.checker.RunGPUs(ctx, preflight.Inputs{Owner: p.hw.Owner(), Node: node}, idle)
	if ctx.Err() != nil {
		return
	}
	p.report(rep, idle)
	if p.last == nil {
		p.last = rep
	} else {
		p.last = p.last.Merge(rep)
	}
	p.metrics.Set(p.last)
}

// report turns a re-check into health observations for the GPUs it read:
// every item of every GPU, so that a cause raised before a restart (the
// monitor keeps it in its state file) clears on the next pass too (a
// cleared observation of a cause the monitor does not hold costs
// nothing).
func (p *preflighter) report(rep *preflight.Report, uuids []string) {
	type key struct{ uuid, item string }
	worst := map[key]preflight.Result{}
	for _, r := range rep.Results {
		// One verdict per item and GPU (node-wide results, Device "",
		// are no GPU's); a failure wins.
		k := key{r.Device, r.Item}
		if old, ok := worst[k]; !ok || old.Status != preflight.Fail {
			worst[k] = r
		}
	}
	for _, uuid := range uuids {
		for _, item := range preflight.GPUItems {
			r, ok := worst[key{uuid, item}]
			if !ok {
				continue
			}
			o := health.Observation{DeviceID: uuid, Kind: health.KindGPU, Check: health.CheckPreflight, Key: item}
			if r.Status == preflight.Fail {
				o.Fatal, o.Reason = true, "preflight "+item+": "+r.Detail
			} else {
				o.Cleared = true
			}
			p.observe(o)
		}
	}
}

// heldGPUs names the GPUs of node that pods hold (a GPU, one of its MIG
// devices or one of its time-sliced replicas), as "GPU <index>"; none
// while the kubelet's answer is unknown.
func heldGPUs(node *topology.Node, asg *usage.Assignments) []string {
	if node == nil || asg == nil {
		return nil
	}
	var out []string
	for _, g := range node.GPUs {
		if holds(asg, g) {
			out = append(out, fmt.Sprintf("GPU %d", g.Index))
		}
	}
	return out
}

// holds says whether a pod holds g or one of its MIG devices
// (Assignments.Of covers time-sliced replicas of either).
func holds(asg *usage.Assignments, g topology.GPU) bool {
	if len(asg.Of(g.UUID)) > 0 {
		return true
	}
	return slices.ContainsFunc(g.MIG, func(m topology.MIGDevice) bool { return len(asg.Of(m.UUID)) > 0 })
}

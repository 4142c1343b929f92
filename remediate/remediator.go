// Package remediate closes the loop from a GPU fault back to a healthy
// node, each step opt-in (Config): a GPU whose fault needs a reset is
// reset once no pod holds it and no process uses it (reset.go); the pods
// holding it are evicted first when drain is on; a fault that needs a
// reboot, or a reset that failed, writes the sentinel file kured watches
// and sets a Node condition a NodeHealthCheck can select (reboot.go). The
// agent never reboots the node itself. Every step that takes capacity
// away first takes the fleet safeguard's slot (the taint's), posts an
// Event on the Node and is counted in gpu_node_agent_remediation_total.
package remediate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/signals"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// Actions and results of gpu_node_agent_remediation_total.
const (
	ActionReset  = "reset"
	ActionDrain  = "drain"
	ActionReboot = "reboot"

	// ResultSuccess: the step was done (a GPU reset, a pod evicted, the
	// reboot requested).
	ResultSuccess = "success"
	// ResultFailed and ResultTimeout: the step was tried and did not
	// work, or did not end in time.
	ResultFailed  = "failed"
	ResultTimeout = "timeout"
	// ResultDryRun: the step would have been taken.
	ResultDryRun = "dry-run"
	// ResultRefused: the fleet safeguard had no slot for this node.
	ResultRefused = "refused"
	// ResultUnsafe: the step may not be taken here at all (NVIDIA's reset
	// rules, a pod the agent never evicts).
	ResultUnsafe = "unsafe"
	// ResultBlocked: the step must wait (a PodDisruptionBudget).
	ResultBlocked = "blocked"
	// ResultPaused: the Node's pause annotation stopped it.
	ResultPaused = "paused"
)

// Errors a Cluster's Evict returns.
var (
	// ErrDisruptionBudget: a PodDisruptionBudget does not allow the
	// eviction now (the Eviction API's 429).
	ErrDisruptionBudget = errors.New("eviction refused by a PodDisruptionBudget")
	// ErrNotEvictable: the pod is one the agent never evicts (its own, a
	// DaemonSet's, a static pod, another node's).
	ErrNotEvictable = errors.New("pod not evictable")
)

// Health is the health monitor as the remediator uses it.
type Health interface {
	Remedies() []health.Remedy
	Observe(health.Observation)
	Subscribe() <-chan struct{}
}

// Cluster is the API server as the remediator uses it (kubeapi's
// RemediationAPI). Every method may fail while the API is not reachable
// yet; the remediator tries again later.
type Cluster interface {
	// Paused says the Node carries PauseAnnotation "true".
	Paused(ctx context.Context) (bool, error)
	// AcquireSlot takes, or renews, this node's slot of the fleet
	// safeguard for remediation; refused says why when it is not held.
	AcquireSlot(ctx context.Context) (held bool, refused string, err error)
	// ReleaseSlot gives remediation's hold on the slot up (the slot
	// itself stays while the taint holds it too).
	ReleaseSlot(ctx context.Context) error
	// Evict evicts a pod through the Eviction API with grace (nil: the
	// pod's own), ErrDisruptionBudget or ErrNotEvictable wrapped when it
	// may not.
	Evict(ctx context.Context, namespace, name, uid string, grace *time.Duration) error
	// SetCondition sets the Node condition typ to status True (required)
	// or False; a False condition is not written where none exists.
	SetCondition(ctx context.Context, typ string, required bool, reason, message string) error
	// Event posts an Event on the Node (never blocks).
	Event(eventType, reason, message string)
	// Changes is signalled when the Node changes (the pause annotation).
	Changes() <-chan struct{}
}

// Options are what the remediator reads and acts through.
type Options struct {
	Health  Health
	Cluster Cluster
	// Resetter resets GPUs (default ExecResetter with the config's
	// command).
	Resetter Resetter
	// Node is the node model served now (nil before discovery).
	Node func() *topology.Node
	// Assignments are the kubelet's device assignments (nil: unknown).
	Assignments func() *usage.Assignments
	// Processes is how many processes NVML lists on the GPU or its MIG
	// devices; known false when the lists could not be read.
	Processes func(gpu string) (n int, known bool)
	// Changes are further signals to look again (the usage tracker's
	// cycles).
	Changes []<-chan struct{}
	// HostRoot is where the host's / is (the sentinel is written under
	// it, boot_id and Fabric Manager are read under it).
	HostRoot string
	// FabricManager says nv-fabricmanager runs (default: looked up under
	// HostRoot's proc).
	FabricManager func() bool
	// ReleaseNVML lets go of the agent's own NVML session for the reset
	// (nvmlowner.Owner.Release; nil: none to release); resume takes it
	// up again.
	ReleaseNVML func(ctx context.Context) (resume func(), err error)
	Logger      *slog.Logger
	Registerer  prometheus.Registerer
}

// Remediator runs the remediation loop of one node (Run).
type Remediator struct {
	cfg  Config
	opts Options
	log  *slog.Logger
	now  func() time.Time

	total *prometheus.CounterVec

	// notes are the last message noted per key (an Event and a count
	// only when it changes), cleared with the fault.
	notes map[string]string
	// lastReset is when each GPU was last reset successfully.
	lastReset map[string]time.Time
	// failed says why a GPU's reset failed: it asks for a reboot now.
	failed map[string]string
	// reboot is the reboot request made (nil: none).
	reboot *sentinel
	// holding says the safeguard may hold something for remediation that
	// settle gives back: its slot, or, after a refusal, the watch the
	// refused node follows a bucket of slots with.
	holding bool
}

// New returns the remediator for cfg (validated, defaults applied here).
func New(cfg Config, opts Options) (*Remediator, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Resetter == nil {
		opts.Resetter = ExecResetter{Command: cfg.Reset.Command}
	}
	if opts.FabricManager == nil {
		root := opts.HostRoot
		opts.FabricManager = func() bool { return FabricManagerRunning(root) }
	}
	r := &Remediator{cfg: cfg, opts: opts, log: opts.Logger, now: time.Now,
		notes: map[string]string{}, lastReset: map[string]time.Time{}, failed: map[string]string{}}
	r.total = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpu_node_agent_remediation_total",
		Help: "Remediation steps by action (reset, drain, reboot) and result (success, failed, timeout, dry-run, refused by the fleet safeguard, unsafe, blocked, paused).",
	}, []string{"action", "result"})
	for _, a := range []string{ActionReset, ActionDrain, ActionReboot} {
		for _, res := range []string{ResultSuccess, ResultFailed, ResultTimeout, ResultDryRun, ResultRefused, ResultUnsafe, ResultBlocked, ResultPaused} {
			r.total.WithLabelValues(a, res)
		}
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(r.total); err != nil {
			return nil, fmt.Errorf("remediation metrics: %w", err)
		}
	}
	return r, nil
}

// Run reconciles at start, on every health, Node and assignment change
// and every RetryInterval, until ctx ends. Steps run one at a time on
// this goroutine: at most one GPU is reset at once.
func (r *Remediator) Run(ctx context.Context) {
	r.restore()
	wake := signals.FanIn(ctx, append([]<-chan struct{}{r.opts.Health.Subscribe(), r.opts.Cluster.Changes()}, r.opts.Changes...)...)
	tick := time.NewTicker(time.Duration(r.cfg.RetryInterval))
	defer tick.Stop()
	for {
		r.Reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-tick.C:
		}
	}
}

// need is what one GPU's faults ask for.
type need struct {
	gpu     string
	action  string
	reasons []string
	// seen is when a check last reported one of the faults.
	seen time.Time
}

// Reconcile looks at the faults once and takes the steps they allow.
func (r *Remediator) Reconcile(ctx context.Context) {
	needs := map[string]*need{}
	for _, rm := range r.opts.Health.Remedies() {
		n := needs[rm.GPU]
		if n == nil {
			n = &need{gpu: rm.GPU, action: rm.Action}
			needs[rm.GPU] = n
		}
		if rm.Action == health.ActionReboot {
			n.action = health.ActionReboot
		}
		if rm.Seen.After(n.seen) {
			n.seen = rm.Seen
		}
		for _, why := range rm.Reasons {
			if rm.Device != rm.GPU {
				why = rm.Device + ": " + why
			}
			n.reasons = append(n.reasons, why)
		}
	}
	for gpu := range r.failed {
		if needs[gpu] == nil {
			delete(r.failed, gpu)
		}
	}
	for key := range r.notes {
		// A GPU that no longer needs anything: a later fault of it is
		// posted again, even with the same words.
		if rest, ok := strings.CutPrefix(key, "reset/"); ok {
			if gpu, _, _ := strings.Cut(rest, "/"); needs[gpu] == nil {
				delete(r.notes, key)
			}
		}
	}
	if len(needs) == 0 {
		r.settle(ctx)
		return
	}
	if paused, err := r.opts.Cluster.Paused(ctx); err != nil {
		r.log.Warn("remediation waits: the Node cannot be read", "err", err)
		return
	} else if paused {
		var what []string
		for _, gpu := range slices.Sorted(maps.Keys(needs)) {
			what = append(what, gpu+" needs "+needs[gpu].action)
		}
		if r.note(ctx, "paused", "", "", corev1.EventTypeNormal, "RemediationPaused",
			fmt.Sprintf("remediation paused by the Node annotation %s=true; left to the operator: %s", PauseAnnotation, strings.Join(what, "; "))) {
			// One count per step the pause holds back.
			for _, a := range pausedActions(needs) {
				r.count(a, ResultPaused)
			}
		}
		return
	}
	delete(r.notes, "paused")
	var reboot []string
	for _, gpu := range slices.Sorted(maps.Keys(needs)) {
		n := needs[gpu]
		switch {
		case n.action == health.ActionReboot:
			reboot = append(reboot, gpu+": "+strings.Join(n.reasons, ", "))
		case r.failed[gpu] != "":
			reboot = append(reboot, gpu+": "+r.failed[gpu])
		}
	}
	if len(reboot) > 0 && r.requestReboot(ctx, reboot) {
		// The reboot resets every GPU: nothing else to do here.
		return
	}
	for _, gpu := range slices.Sorted(maps.Keys(needs)) {
		if n := needs[gpu]; n.action == health.ActionResetGPU && r.failed[gpu] == "" {
			r.remedyReset(ctx, n)
			if r.failed[gpu] != "" && r.cfg.Reboot.Enabled {
				r.requestReboot(ctx, []string{gpu + ": " + r.failed[gpu]})
				return
			}
		}
	}
}

// settle ends remediation when no fault asks for it: a reboot request of
// ours is withdrawn (the sentinel removed, the condition False), the slot
// given back and the notes forgotten.
func (r *Remediator) settle(ctx context.Context) {
	if r.reboot != nil {
		if err := r.withdrawReboot(ctx, "no GPU fault asks for a reboot any more"); err != nil {
			r.log.Warn("reboot request not withdrawn yet", "err", err)
			return
		}
	}
	if r.holding {
		if err := r.opts.Cluster.ReleaseSlot(ctx); err != nil {
			r.log.Warn("fleet safeguard slot not released yet", "err", err)
			return
		}
		r.holding = false
	}
	clear(r.notes)
}

// remedyReset takes the next step towards resetting one GPU.
func (r *Remediator) remedyReset(ctx context.Context, n *need) {
	key := "reset/" + n.gpu
	faults := strings.Join(n.reasons, ", ")
	if !r.cfg.Reset.Enabled {
		r.note(ctx, key, "", "", corev1.EventTypeWarning, "GPUResetNeeded",
			fmt.Sprintf("GPU %s needs a reset (%s); remediation.reset is not enabled: reset it or reboot the node", n.gpu, faults))
		return
	}
	node := r.opts.Node()
	g, ok := gpuOf(node, n.gpu)
	if !ok {
		r.note(ctx, key, "", "", corev1.EventTypeWarning, "GPUResetWaiting", fmt.Sprintf("GPU %s needs a reset (%s) but is not in the discovered node", n.gpu, faults))
		return
	}
	if last, ok := r.lastReset[n.gpu]; ok && !n.seen.After(last) {
		// The checks have not looked at the GPU since its reset: what
		// asks for one is what they saw before it.
		r.log.Debug("GPU reset; waiting for the checks to look at it again", "gpu", n.gpu)
		return
	}
	if last, ok := r.lastReset[n.gpu]; ok && r.now().Sub(last) < time.Duration(r.cfg.Reset.RetryWindow) {
		r.failed[n.gpu] = fmt.Sprintf("needs a reset again %s after the last one (%s)", r.now().Sub(last).Round(time.Second), faults)
		r.note(ctx, key, ActionReset, ResultFailed, corev1.EventTypeWarning, "GPUResetFailed",
			fmt.Sprintf("GPU %s %s: not reset again; a reboot is needed", n.gpu, r.failed[n.gpu]))
		return
	}
	a := r.opts.Assignments()
	if a == nil {
		r.note(ctx, key, "", "", corev1.EventTypeNormal, "GPUResetWaiting",
			fmt.Sprintf("GPU %s needs a reset (%s); waiting: the kubelet's pod resources cannot be read, so whether a pod holds it is unknown", n.gpu, faults))
		return
	}
	if listed := a.Listed(); !listed.IsZero() && listed.Before(n.seen) {
		// The kubelet's assignments were read before the fault was
		// (last) seen: a pod given the GPU in between is not in them.
		// The tracker's next cycle (Options.Changes) brings fresh ones.
		r.log.Debug("GPU needs a reset; waiting for the kubelet's pod resources read after the fault", "gpu", n.gpu, "listed", listed, "seen", n.seen)
		return
	}
	if holders := holdersOf(a, g); len(holders) > 0 {
		r.drain(ctx, n, g, holders)
		return
	}
	if procs, known := r.opts.Processes(n.gpu); !known || procs > 0 {
		msg := fmt.Sprintf("GPU %s needs a reset (%s); waiting: %d processes still use it", n.gpu, faults, procs)
		if !known {
			msg = fmt.Sprintf("GPU %s needs a reset (%s); waiting: its processes cannot be listed", n.gpu, faults)
		}
		r.note(ctx, key, "", "", corev1.EventTypeNormal, "GPUResetWaiting", msg)
		return
	}
	if why := resetUnsafe(g, node, r.cfg.Reset.AllowMIG, r.opts.FabricManager); why != "" {
		// A reboot resets every GPU whatever these rules say.
		r.failed[n.gpu] = "cannot be reset on its own: " + why
		r.note(ctx, key, ActionReset, ResultUnsafe, corev1.EventTypeWarning, "GPUResetRefused",
			fmt.Sprintf("GPU %s (%s) needs a reset (%s) but is not reset: %s", n.gpu, g.PCIBusID, faults, why))
		return
	}
	cmd := strings.Join(append(slices.Clone(r.cfg.Reset.Command), "-r", "-i", g.PCIBusID), " ")
	if r.cfg.Reset.DryRun {
		r.note(ctx, key, ActionReset, ResultDryRun, corev1.EventTypeNormal, "GPUReset",
			fmt.Sprintf("dry run: would reset GPU %s (%s) with %s for %s", n.gpu, g.PCIBusID, cmd, faults))
		return
	}
	if !r.slot(ctx, key, ActionReset, fmt.Sprintf("GPU %s not reset", n.gpu)) {
		return
	}
	r.opts.Cluster.Event(corev1.EventTypeNormal, "GPUResetStarted", fmt.Sprintf("resetting GPU %s (%s) with %s for %s", n.gpu, g.PCIBusID, cmd, faults))
	r.log.Info("resetting GPU", "gpu", n.gpu, "busID", g.PCIBusID, "faults", faults)
	start := r.now()
	timedOut, err := r.reset(ctx, g)
	took := r.now().Sub(start).Round(time.Millisecond)
	if ctx.Err() != nil {
		return
	}
	delete(r.notes, key)
	if err != nil {
		res := ResultFailed
		if timedOut {
			res = ResultTimeout
		}
		r.failed[n.gpu] = fmt.Sprintf("reset failed: %v", err)
		r.count(ActionReset, res)
		next := "remediation.reboot is not enabled: reboot the node"
		if r.cfg.Reboot.Enabled {
			next = "asking for a reboot"
		}
		r.opts.Cluster.Event(corev1.EventTypeWarning, "GPUResetFailed", fmt.Sprintf("GPU %s (%s) reset %s after %s: %v; %s", n.gpu, g.PCIBusID, res, took, err, next))
		r.log.Error("GPU reset failed", "gpu", n.gpu, "result", res, "err", err)
		return
	}
	r.lastReset[n.gpu] = r.now()
	r.count(ActionReset, ResultSuccess)
	r.opts.Cluster.Event(corev1.EventTypeNormal, "GPUResetSucceeded", fmt.Sprintf("GPU %s (%s) reset in %s; it is offered again once healthy for the recovery period", n.gpu, g.PCIBusID, took))
	r.log.Info("GPU reset", "gpu", n.gpu, "took", took)
	// The driver's own reset is reset evidence, as much as the counters
	// it clears: the held faults are released and recovery starts.
	r.opts.Health.Observe(health.Observation{DeviceID: n.gpu, Kind: health.KindGPU, Check: health.CheckReset, Reset: true,
		Reason: "the agent reset the GPU (" + cmd + ")"})
}

// reset resets g with the agent's own NVML session released: nvidia-smi
// refuses a reset while any application holds the GPU, monitoring ones
// included (nvidia-smi(1), -r).
func (r *Remediator) reset(ctx context.Context, g topology.GPU) (bool, error) {
	if r.opts.ReleaseNVML != nil {
		resume, err := r.opts.ReleaseNVML(ctx)
		if err != nil {
			return false, fmt.Errorf("the agent's NVML session could not be released for the reset: %w", err)
		}
		defer resume()
	}
	return r.opts.Resetter.Reset(ctx, g, time.Duration(r.cfg.Reset.Timeout))
}

// drain evicts the device-plugin pods holding g; pods holding it through
// DRA are evicted by the NoExecute device taint the agent gives a device
// that waits for a drain.
func (r *Remediator) drain(ctx context.Context, n *need, g topology.GPU, holders []usage.Assignment) {
	key := "reset/" + n.gpu
	names := func(as []usage.Assignment) string {
		var out []string
		for _, a := range as {
			out = append(out, a.Namespace+"/"+a.Pod)
		}
		return strings.Join(out, ", ")
	}
	if !r.cfg.Drain.Enabled {
		r.note(ctx, key, "", "", corev1.EventTypeNormal, "GPUResetWaiting",
			fmt.Sprintf("GPU %s needs a reset (%s); waiting for the pods holding it to end (%s): remediation.drain is not enabled", n.gpu, strings.Join(n.reasons, ", "), names(holders)))
		return
	}
	var plugin, claimed []usage.Assignment
	for _, h := range holders {
		if h.Claim != "" {
			claimed = append(claimed, h)
		} else {
			plugin = append(plugin, h)
		}
	}
	if len(claimed) > 0 {
		r.note(ctx, key+"/dra", "", "", corev1.EventTypeNormal, "GPUResetWaiting",
			fmt.Sprintf("GPU %s needs a reset; its DRA claims' pods (%s) are evicted by its NoExecute device taint", n.gpu, names(claimed)))
	}
	var grace *time.Duration
	if g := r.cfg.Drain.GracePeriod; g != nil {
		d := time.Duration(*g)
		grace = &d
	}
	for _, h := range plugin {
		pkey := "evict/" + h.Namespace + "/" + h.Pod
		what := fmt.Sprintf("pod %s/%s holding GPU %s, which needs a reset (%s)", h.Namespace, h.Pod, n.gpu, strings.Join(n.reasons, ", "))
		if r.cfg.Drain.DryRun {
			r.note(ctx, pkey, ActionDrain, ResultDryRun, corev1.EventTypeNormal, "GPUPodEviction", "dry run: would evict "+what)
			continue
		}
		if !r.slot(ctx, pkey, ActionDrain, "pod "+h.Namespace+"/"+h.Pod+" not evicted") {
			return
		}
		err := r.opts.Cluster.Evict(ctx, h.Namespace, h.Pod, h.PodUID, grace)
		switch {
		case err == nil:
			r.note(ctx, pkey, ActionDrain, ResultSuccess, corev1.EventTypeNormal, "GPUPodEvicted", "evicted "+what)
		case errors.Is(err, ErrDisruptionBudget):
			r.note(ctx, pkey, ActionDrain, ResultBlocked, corev1.EventTypeWarning, "GPUPodEvictionBlocked",
				fmt.Sprintf("not evicting %s yet: %v; retrying every %s", what, err, r.cfg.RetryInterval))
		case errors.Is(err, ErrNotEvictable):
			r.note(ctx, pkey, ActionDrain, ResultUnsafe, corev1.EventTypeWarning, "GPUPodEvictionRefused",
				fmt.Sprintf("never evicting %s: %v; left to the operator", what, err))
		default:
			r.note(ctx, pkey, ActionDrain, ResultFailed, corev1.EventTypeWarning, "GPUPodEvictionFailed", fmt.Sprintf("evicting %s failed: %v", what, err))
		}
	}
}

// slot takes the fleet safeguard's slot for a step; refused, it notes the
// refusal under key (one Event and one count per refusal) and returns
// false. Asking again while refused is the same refusal, however its
// words read (the slots the safeguard read this time): it is not noted
// again.
func (r *Remediator) slot(ctx context.Context, key, action, what string) bool {
	held, refused, err := r.opts.Cluster.AcquireSlot(ctx)
	if err != nil {
		r.log.Warn("fleet safeguard not asked; the step waits", "action", action, "err", err)
		return false
	}
	r.holding = true
	if !held {
		if !strings.HasPrefix(r.notes[key], refusedReason+"\x00") {
			r.note(ctx, key, action, ResultRefused, corev1.EventTypeWarning, refusedReason, fmt.Sprintf("fleet safeguard: %s; %s", refused, what))
		}
		return false
	}
	return true
}

// refusedReason is the Event reason of a step the fleet safeguard refused.
const refusedReason = "RemediationRefused"

// note posts an Event, logs and counts (action and result, when set) once
// per distinct message under key; it reports whether it did.
func (r *Remediator) note(_ context.Context, key, action, result, eventType, reason, msg string) bool {
	if r.notes[key] == reason+"\x00"+msg {
		return false
	}
	r.notes[key] = reason + "\x00" + msg
	if action != "" {
		r.count(action, result)
	}
	r.opts.Cluster.Event(eventType, reason, msg)
	if eventType == corev1.EventTypeWarning {
		r.log.Warn(msg, "reason", reason)
	} else {
		r.log.Info(msg, "reason", reason)
	}
	return true
}

// pausedActions are the steps the needs ask for: reset (and drain) for a
// GPU that needs a reset, reboot for one that needs a reboot.
func pausedActions(needs map[string]*need) []string {
	var reset, reboot bool
	for _, n := range needs {
		reset = reset || n.action == health.ActionResetGPU
		reboot = reboot || n.action == health.ActionReboot
	}
	var out []string
	if reset {
		out = append(out, ActionReset)
	}
	if reboot {
		out = append(out, ActionReboot)
	}
	return out
}

func (r *Remediator) count(action, result string) { r.total.WithLabelValues(action, result).Inc() }

// gpuOf finds GPU uuid in n.
func gpuOf(n *topology.Node, uuid string) (topology.GPU, bool) {
	if n == nil {
		return topology.GPU{}, false
	}
	for _, g := range n.GPUs {
		if g.UUID == uuid {
			return g, true
		}
	}
	return topology.GPU{}, false
}

// holdersOf are the containers holding g or one of its MIG devices, one
// per pod and claim.
func holdersOf(a *usage.Assignments, g topology.GPU) []usage.Assignment {
	ids := []string{g.UUID}
	for _, m := range g.MIG {
		ids = append(ids, m.UUID)
	}
	var out []usage.Assignment
	seen := map[string]bool{}
	for _, id := range ids {
		for _, as := range a.Of(id) {
			k := as.Namespace + "/" + as.Pod + "/" + as.Claim
			if !seen[k] {
				seen[k] = true
				out = append(out, as)
			}
		}
	}
	return out
}

package usage

import (
	"context"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// trainRunning sets up ml/train-0 holding gpu0, as the kubelet shows it.
func (r *rig) trainRunning() {
	r.kubelet.Set(pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)))
	r.host.checkpoint(CheckpointEntry{PodUID: uidTrain, Container: "trainer", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpu0}})
	r.host.podLogs("ml", "train-0", uidTrain)
}

// trainDeleted is what the node shows once ml/train-0 is deleted: gone
// from the kubelet's List and its log directory, its checkpoint entry
// lingering (the kubelet drops it lazily).
func (r *rig) trainDeleted() {
	r.kubelet.Set()
	r.host.rmPodLogs("ml", "train-0", uidTrain)
}

// TestZombieAfterGrace: a GPU pod runs; it is deleted while a process of
// it keeps memory on its GPU. After the grace period the GPU has a
// zombie finding (unhealthy), one Event names the PID, the pod and the
// memory; once the process is gone and the memory freed the finding
// clears. The pod's own process was never flagged while it ran.
func TestZombieAfterGrace(t *testing.T) {
	r := newRig(t, true)
	r.trainRunning()
	r.host.proc(4242, 77001, "python3", "S", podCgroup(uidTrain))
	busy := gpuSample(gpu0, 30000, 500, nvmlProc(4242, 29000))

	// Running for longer than the grace: own, never a finding.
	for range 20 {
		r.cycle(busy, gpuSample(gpu1, 500, 500))
		r.clock.Step(15 * time.Second)
	}
	if got := r.health.reason(gpu0, ClassZombie) + r.health.reason(gpu0, ClassForeign) + r.health.reason(gpu0, ClassLeaked); got != "" {
		t.Fatalf("a running pod's own process was flagged: %q", got)
	}
	if n := testutil.CollectAndCount(r.tr.metrics, "gpu_node_agent_gpu_process_findings"); n != 0 {
		t.Errorf("findings series while the pod runs = %d, want 0", n)
	}
	// The first judged cycle cleared every class on every device, so a
	// cause persisted by a previous run cannot outlive it.
	cleared := map[string]bool{}
	for _, o := range r.health.observations() {
		if o.Cleared && o.Check == health.CheckGPUProcesses {
			cleared[o.DeviceID+"/"+o.Key] = true
		}
	}
	// Only devices sampled are judged: gpu2 and its MIG devices were not.
	for _, dev := range []string{gpu0, gpu1} {
		for _, c := range findingClasses {
			if !cleared[dev+"/"+string(c)] {
				t.Errorf("no initial Cleared observation for %s/%s", dev, c)
			}
		}
	}

	r.trainDeleted()
	deleted := r.clock.Now()
	r.cycle(busy, gpuSample(gpu1, 500, 500))
	if got := r.health.reason(gpu0, ClassZombie); got != "" {
		t.Fatalf("zombie reported at once, before the grace: %q", got)
	}
	r.clock.Step(time.Minute)
	r.cycle(busy, gpuSample(gpu1, 500, 500))
	if got := r.health.reason(gpu0, ClassZombie); got != "" {
		t.Fatalf("zombie reported within the grace: %q", got)
	}
	r.clock.Step(time.Minute)
	r.cycle(busy, gpuSample(gpu1, 500, 500))
	reason := r.health.reason(gpu0, ClassZombie)
	if !strings.Contains(reason, "pid 4242") || !strings.Contains(reason, "ml/train-0") {
		t.Fatalf("zombie health reason after the grace = %q, want pid 4242, pod ml/train-0", reason)
	}
	// The zombie's memory moving is no new observation (no Node
	// condition update per cycle); the Event carries the amount.
	r.health.mu.Lock()
	observed := len(r.health.obs)
	r.health.mu.Unlock()
	r.cycle(gpuSample(gpu0, 30500, 500, nvmlProc(4242, 29500)), gpuSample(gpu1, 500, 500))
	r.health.mu.Lock()
	if n := len(r.health.obs); n != observed {
		t.Errorf("%d more observations after the zombie's memory moved: %+v", n-observed, r.health.obs[observed:])
	}
	r.health.mu.Unlock()
	if elapsed := r.clock.Since(deleted); elapsed != DefaultGrace {
		t.Errorf("zombie observed %s after the deletion, want the grace %s", elapsed, DefaultGrace)
	}
	evs := r.events.byReason(ReasonZombie)
	if len(evs) != 1 {
		t.Fatalf("zombie events = %+v, want 1", evs)
	}
	for _, want := range []string{"process 4242 (python3)", "pod ml/train-0 (uid " + uidTrain + ")", "container aaefb9d8feed", "holding 28.3 GiB", "for 2m0s", gpu0} {
		if !strings.Contains(evs[0].msg, want) {
			t.Errorf("event %q lacks %q", evs[0].msg, want)
		}
	}
	if evs[0].typ != "Warning" {
		t.Errorf("event type %s, want Warning", evs[0].typ)
	}
	// Later cycles with the same zombie: no new Event, no new observation.
	obs := len(r.health.observations())
	for range 5 {
		r.clock.Step(10 * time.Second)
		r.cycle(busy, gpuSample(gpu1, 500, 500))
	}
	if n := len(r.events.byReason(ReasonZombie)); n != 1 {
		t.Errorf("zombie events after more cycles = %d, want still 1 (only on change)", n)
	}
	if n := len(r.health.observations()); n != obs {
		t.Errorf("observations after more cycles = %d, want %d (only on change)", n, obs)
	}
	if got := gauge(t, r, "gpu_node_agent_gpu_process_findings", map[string]string{"device": gpu0, "class": "zombie"}); got != 1 {
		t.Errorf("findings{%s,zombie} = %v, want 1", gpu0, got)
	}

	// Freed: the process exits and its memory goes.
	r.host.killProc(4242)
	r.cycle(gpuSample(gpu0, 500, 500), gpuSample(gpu1, 500, 500))
	if got := r.health.reason(gpu0, ClassZombie); got != "" {
		t.Errorf("zombie still reported after the process exited: %q", got)
	}
	if len(r.signals.signals()) != 0 {
		t.Errorf("signals sent in report mode: %v", r.signals.signals())
	}
}

// gauge gathers r's registry and returns the value of the gauge name with
// the given labels (-1 when there is no such series).
func gauge(t *testing.T, r *rig, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			for k, v := range labels {
				if l[k] != v {
					continue metrics
				}
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestMissingDataKeepsState: a flagged zombie is neither cleared nor
// re-reported by cycles that cannot judge (process list not read, the
// kubelet not answering, the GPU unreadable); it clears on the first
// cycle that sees it gone.
func TestMissingDataKeepsState(t *testing.T) {
	r := newRig(t, true)
	r.trainRunning()
	r.host.proc(4242, 77001, "python3", "D", podCgroup(uidTrain))
	busy := gpuSample(gpu0, 30000, 500, nvmlProc(4242, 29000))
	r.cycle(busy)
	r.trainDeleted()
	r.cycle(busy)
	r.clock.Step(DefaultGrace)
	r.cycle(busy)
	if r.health.reason(gpu0, ClassZombie) == "" {
		t.Fatal("zombie not reported after the grace")
	}
	notRead := gpuSample(gpu0, 500, 500)
	notRead.ProcessesRead = nvmlowner.Value{Status: nvmlowner.NotSupported}
	lost := nvmlowner.Sample{UUID: gpu0, Err: nvml.ERROR_GPU_IS_LOST}
	steps := []struct {
		name   string
		before func()
		sample nvmlowner.Sample
	}{
		{"process list not supported", nil, notRead},
		{"GPU unreadable", nil, lost},
		{"kubelet failing", func() { r.kubelet.Fail(errKubeletDown) }, gpuSample(gpu0, 500, 500)},
	}
	for _, s := range steps {
		if s.before != nil {
			s.before()
		}
		r.clock.Step(time.Minute)
		r.cycle(s.sample)
		if r.health.reason(gpu0, ClassZombie) == "" {
			t.Errorf("%s: the zombie finding was cleared from missing data", s.name)
		}
		if r.health.reason(gpu0, ClassLeaked) != "" {
			t.Errorf("%s: leaked reported from missing data", s.name)
		}
	}
	if got := testutil.ToFloat64(r.tr.pods.errors); got != 1 {
		t.Errorf("pod_resources_errors_total = %v, want 1", got)
	}
	if r.tr.Assignments() != nil {
		t.Error("Assignments after a failed List must be nil (unknown)")
	}
	r.kubelet.Set()
	r.host.killProc(4242)
	r.cycle(gpuSample(gpu0, 500, 500))
	if got := r.health.reason(gpu0, ClassZombie); got != "" {
		t.Errorf("zombie not cleared once seen gone: %q", got)
	}
	if n := len(r.events.byReason(ReasonZombie)); n != 1 {
		t.Errorf("zombie events = %d, want 1", n)
	}
}

// TestLeakedAndForeign: memory with no process (leaked) and a running
// pod's process on another pod's GPU (foreign), each after the grace.
func TestLeakedAndForeign(t *testing.T) {
	r := newRig(t, true)
	r.trainRunning()
	r.kubelet.Set(
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)),
		pod("ops", "monitor", container("agent", "")),
	)
	r.host.podLogs("ops", "monitor", uidNoGPU)
	r.host.proc(5000, 88000, "python3", "S", podCgroup(uidTrain))
	r.host.proc(5001, 88001, "nvtop", "S", podCgroup(uidNoGPU))
	samples := []nvmlowner.Sample{
		gpuSample(gpu0, 30000, 500, nvmlProc(5000, 28000), nvmlProc(5001, 400)),
		gpuSample(gpu1, 6644, 500), // 6 GiB allocated, no process
	}
	r.cycle(samples...)
	r.clock.Step(DefaultGrace)
	r.cycle(samples...)
	if got := r.health.reason(gpu1, ClassLeaked); got != "memory allocated with no process" {
		t.Errorf("leaked reason on gpu1 = %q, want memory allocated with no process", got)
	}
	if evs := r.events.byReason(ReasonLeaked); len(evs) != 1 || !strings.Contains(evs[0].msg, "6.0 GiB of memory allocated on "+gpu1) {
		t.Errorf("leaked Events = %+v, want one naming 6.0 GiB on gpu1", evs)
	}
	if got := r.health.reason(gpu0, ClassForeign); !strings.Contains(got, "pid 5001") || !strings.Contains(got, "ops/monitor") {
		t.Errorf("foreign reason on gpu0 = %q, want pid 5001 of ops/monitor", got)
	}
	if got := r.health.reason(gpu0, ClassZombie); got != "" {
		t.Errorf("gpu0 has a zombie: %q", got)
	}
	if evs := r.events.byReason(ReasonLeaked); len(evs) != 1 || !strings.Contains(evs[0].msg, "6.0 GiB") || !strings.Contains(evs[0].msg, gpu1) {
		t.Errorf("leaked events = %+v", evs)
	}
	if evs := r.events.byReason(ReasonForeign); len(evs) != 1 || !strings.Contains(evs[0].msg, "assigned to ml/train-0 (trainer)") {
		t.Errorf("foreign events = %+v", evs)
	}
}

// TestMIGDevices: processes on MIG devices are judged per MIG device
// when MIG devices are served, and against their GPU when not.
func TestMIGDevices(t *testing.T) {
	for _, served := range []bool{true, false} {
		t.Run(map[bool]string{true: "served", false: "whole GPUs"}[served], func(t *testing.T) {
			r := newRig(t, true, func(c *Config, _ *Options) { c.MIGDevicesServed = served })
			r.kubelet.Set()
			r.host.checkpoint()
			r.host.proc(6000, 99000, "python3", "S", hostCgroup)
			p := nvmlProc(6000, 3000)
			p.MIG = mig1
			s := gpuSample(gpu2, 0, 0, p)
			s.MIG = []nvmlowner.MIGSample{{UUID: mig0, FBUsed: nvmlowner.Value{V: 13 * mib, Status: nvmlowner.OK}},
				{UUID: mig1, FBUsed: nvmlowner.Value{V: 3013 * mib, Status: nvmlowner.OK}}}
			r.cycle(s)
			r.clock.Step(DefaultGrace)
			r.cycle(s)
			want, other := mig1, gpu2
			if !served {
				want, other = gpu2, mig1
			}
			if r.health.reason(want, ClassZombie) == "" {
				t.Errorf("no zombie on %s", want)
			}
			if r.health.reason(other, ClassZombie) != "" {
				t.Errorf("zombie on %s too", other)
			}
			if r.health.reason(mig0, ClassLeaked) != "" {
				t.Error("an idle MIG device (13 MiB used) reported leaked")
			}
		})
	}
}

// TestKill: with action kill a zombie gets SIGTERM after the grace, then
// SIGKILL after the kill grace when it ignores SIGTERM; each an Event.
// Once gone and freed, the GPU's finding clears. A running pod's own
// process and a foreign one are never signalled.
func TestKill(t *testing.T) {
	r := newRig(t, true, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
	r.trainRunning()
	r.kubelet.Set(
		pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)),
		pod("ops", "monitor", container("agent", "")),
	)
	r.host.podLogs("ops", "monitor", uidNoGPU)
	r.host.proc(4242, 77001, "python3", "S", podCgroup(uidGone))
	r.host.proc(5000, 88000, "python3", "S", podCgroup(uidTrain))
	r.host.proc(5001, 88001, "nvtop", "S", podCgroup(uidNoGPU))
	r.signals.ignore = map[uint32][]syscall.Signal{4242: {syscall.SIGTERM}}
	zombieAlive := true
	r.signals.exited = func(pid uint32) {
		if pid == 4242 {
			zombieAlive = false
		}
	}
	samples := func() []nvmlowner.Sample {
		s := []nvmlowner.Sample{gpuSample(gpu0, 30000, 500, nvmlProc(5000, 28000), nvmlProc(5001, 400))}
		if zombieAlive {
			return append(s, gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000)))
		}
		return append(s, gpuSample(gpu1, 500, 500))
	}
	r.cycle(samples()...)
	r.clock.Step(DefaultGrace - time.Second)
	r.cycle(samples()...)
	if s := r.signals.signals(); len(s) != 0 {
		t.Fatalf("signals within the grace: %v", s)
	}
	r.clock.Step(time.Second)
	r.cycle(samples()...)
	if s := r.signals.signals(); !slices.Equal(s, []string{"4242:SIGTERM"}) {
		t.Fatalf("signals after the grace = %v, want SIGTERM to the zombie only", s)
	}
	r.clock.Step(DefaultKillGrace - time.Second)
	r.cycle(samples()...)
	if s := r.signals.signals(); len(s) != 1 {
		t.Fatalf("signals within the kill grace = %v", s)
	}
	r.clock.Step(time.Second)
	r.cycle(samples()...)
	if s := r.signals.signals(); !slices.Equal(s, []string{"4242:SIGTERM", "4242:SIGKILL"}) {
		t.Fatalf("signals after the kill grace = %v, want SIGTERM then SIGKILL", s)
	}
	r.host.killProc(4242)
	r.cycle(samples()...)
	if got := r.health.reason(gpu1, ClassZombie); got != "" {
		t.Errorf("gpu1 still has a zombie after the kill: %q", got)
	}
	evs := r.events.byReason(ReasonKilled)
	if len(evs) != 2 || !strings.Contains(evs[0].msg, "sent SIGTERM to zombie process 4242") ||
		!strings.Contains(evs[1].msg, "sent SIGKILL to zombie process 4242") || !strings.Contains(evs[0].msg, "uid "+uidGone) {
		t.Errorf("kill events = %+v", evs)
	}
	for _, sig := range []string{"SIGTERM", "SIGKILL"} {
		if got := testutil.ToFloat64(r.tr.metrics.kills.WithLabelValues(sig)); got != 1 {
			t.Errorf("zombie_kills_total{signal=%s} = %v, want 1", sig, got)
		}
	}
	// The foreign process was reported, never signalled.
	if r.health.reason(gpu0, ClassForeign) == "" {
		t.Error("the foreign process on gpu0 was not reported")
	}
	for _, s := range r.signals.signals() {
		if !strings.HasPrefix(s, "4242:") {
			t.Errorf("signalled a process that is not the zombie: %s", s)
		}
	}
}

// TestKillFailsOnUninterruptible: a zombie in D state ignores every
// signal; after SIGKILL and another kill grace one Event says so and no
// more signals are sent; the device stays unhealthy.
func TestKillFailsOnUninterruptible(t *testing.T) {
	r := newRig(t, true, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
	r.kubelet.Set()
	r.host.checkpoint()
	r.host.proc(4242, 77001, "python3", "D", hostCgroup)
	r.signals.ignore = map[uint32][]syscall.Signal{4242: {syscall.SIGTERM, syscall.SIGKILL}}
	s := gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000))
	r.cycle(s)
	for range 12 {
		r.clock.Step(DefaultKillGrace)
		r.cycle(s)
	}
	if got := r.signals.signals(); !slices.Equal(got, []string{"4242:SIGTERM", "4242:SIGKILL"}) {
		t.Errorf("signals = %v, want one SIGTERM and one SIGKILL", got)
	}
	evs := r.events.byReason(ReasonKillFailed)
	if len(evs) != 1 || !strings.Contains(evs[0].msg, "state D") {
		t.Errorf("kill-failed events = %+v, want one naming state D", evs)
	}
	if r.health.reason(gpu1, ClassZombie) == "" {
		t.Error("the unkillable zombie's GPU is not unhealthy")
	}
}

// TestKillOnlyWhenCertain: a zombie whose pod may still run (pod log
// directories unreadable) is reported, never killed; without the host's
// PIDs, kill mode is refused and nothing is judged.
func TestKillOnlyWhenCertain(t *testing.T) {
	t.Run("pod logs unreadable", func(t *testing.T) {
		r := newRig(t, true, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
		r.kubelet.Set(pod("ops", "monitor", container("agent", "")))
		r.host.checkpoint()
		r.host.proc(4242, 77001, "python3", "S", podCgroup(uidGone))
		s := gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000))
		r.cycle(s)
		r.clock.Step(DefaultGrace + DefaultKillGrace)
		r.cycle(s)
		r.clock.Step(DefaultKillGrace)
		r.cycle(s)
		if got := r.health.reason(gpu1, ClassZombie); got == "" {
			t.Error("zombie not reported")
		}
		if evs := r.events.byReason(ReasonZombie); len(evs) != 1 || !strings.Contains(evs[0].msg, "not killed") {
			t.Errorf("zombie events = %+v, want one saying it is not killed", evs)
		}
		if s := r.signals.signals(); len(s) != 0 {
			t.Errorf("signalled %v though the pod may still run", s)
		}
		if got := gauge(t, r, "gpu_node_agent_gpu_process_attribution", map[string]string{"source": SourcePodLogs}); got != 0 {
			t.Errorf("attribution{pod-logs} = %v, want 0", got)
		}
	})
	t.Run("no host PIDs", func(t *testing.T) {
		r := newRig(t, false, func(c *Config, _ *Options) { c.Zombies.Action = ActionKill })
		r.tr.announce()
		r.kubelet.Set()
		r.host.checkpoint()
		r.host.proc(4242, 77001, "python3", "S", hostCgroup)
		s := gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000))
		r.cycle(s)
		r.clock.Step(DefaultGrace + DefaultKillGrace)
		r.cycle(s)
		if evs := r.events.byReason(ReasonKillNotAllowed); len(evs) != 1 || !strings.Contains(evs[0].msg, "hostPID") {
			t.Errorf("kill refusal events = %+v, want one naming hostPID", evs)
		}
		if r.health.reason(gpu1, ClassZombie) != "" || r.health.reason(gpu1, ClassLeaked) != "" {
			t.Error("judged without the host's PIDs")
		}
		if s := r.signals.signals(); len(s) != 0 {
			t.Errorf("signalled %v without the host's PIDs", s)
		}
		if got := gauge(t, r, "gpu_node_agent_gpu_process_attribution", map[string]string{"source": SourceHostPIDs}); got != 0 {
			t.Errorf("attribution{host-pids} = %v, want 0", got)
		}
	})
}

// TestCheckDisabled: with gpu-processes in health.disabledChecks the
// tracker still lists the kubelet's pods for attribution and counts
// processes, and reports nothing to health.
func TestCheckDisabled(t *testing.T) {
	r := newRig(t, true, func(c *Config, _ *Options) { c.Judge = false })
	r.kubelet.Set()
	r.host.checkpoint()
	r.host.proc(4242, 77001, "python3", "S", hostCgroup)
	s := gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000))
	r.cycle(s)
	r.clock.Step(DefaultGrace)
	r.cycle(s)
	if n := len(r.health.observations()); n != 0 {
		t.Errorf("observations with the check disabled: %d", n)
	}
	if n := len(r.events.byReason(ReasonZombie)); n != 0 {
		t.Errorf("events with the check disabled: %+v", r.events.events)
	}
	// The checkpoint and pod log directories are not read for pod labels.
	for _, src := range []string{SourceCheckpoint, SourcePodLogs} {
		if got := gauge(t, r, "gpu_node_agent_gpu_process_attribution", map[string]string{"source": src}); got != 0 {
			t.Errorf("attribution{%s} = %v with the check disabled, want 0", src, got)
		}
	}
	if err := testutil.CollectAndCompare(r.tr.metrics, strings.NewReader(`
# HELP gpu_node_agent_gpu_processes Processes NVML lists on a GPU or MIG device (by UUID), by class: own (of a pod assigned the device), zombie (of a pod that is gone, or of the host, on a device no running pod is assigned), foreign (of another pod or the host on an assigned device, or of a running pod on a device not assigned to it), unknown (not attributable this cycle). Current classes, before the grace period.
# TYPE gpu_node_agent_gpu_processes gauge
gpu_node_agent_gpu_processes{class="zombie",device="`+gpu1+`"} 1
`), "gpu_node_agent_gpu_processes"); err != nil {
		t.Error(err)
	}
}

// TestAllocationsAndAssignments: each cycle with a kubelet answer hands
// the fragmentation collector the node, what is offered and the IDs the
// kubelet allocated; Assignments serves the metrics' pod labels. One List
// per sampling cycle, none for a cycle already handled.
func TestAllocationsAndAssignments(t *testing.T) {
	alloc := &fakeAllocations{}
	r := newRig(t, true, func(_ *Config, o *Options) {
		o.Allocations = alloc
		o.Offered = func() map[string]bool { return map[string]bool{gpu0: true, gpu2: true} }
	})
	updated := r.tr.Subscribe()
	r.trainRunning()
	r.kubelet.Set(pod("ml", "train-0", container("trainer", "nvidia.com/gpu", gpu0)),
		pod("ml", "shared", container("app", "nvidia.com/gpu", gpu1+"::3")))
	r.cycle(gpuSample(gpu0, 500, 500))
	select {
	case <-updated:
	default:
		t.Error("no update signal after a cycle")
	}
	if c, ok := r.tr.Assignments().Container(gpu0); !ok || c.Pod != "train-0" || c.PodUID != uidTrain {
		t.Errorf("Assignments().Container(gpu0) = %+v, %v", c, ok)
	}
	if alloc.calls != 1 || !alloc.allocated[gpu1+"::3"] || !alloc.allocated[gpu0] || alloc.node == nil || alloc.offered(gpu1) {
		t.Errorf("fragmentation update = %+v", alloc)
	}
	r.tr.Cycle(context.Background()) // the same snapshot: nothing to do
	if n := r.kubelet.Calls(); n != 1 {
		t.Errorf("List calls = %d, want 1 per sampling cycle", n)
	}
	r.kubelet.Fail(errKubeletDown)
	r.cycle(gpuSample(gpu0, 500, 500))
	if alloc.calls != 1 {
		t.Error("fragmentation updated from a failed List")
	}
}

type fakeAllocations struct {
	calls     int
	node      *topology.Node
	offered   func(string) bool
	allocated map[string]bool
}

func (f *fakeAllocations) Update(n *topology.Node, offered func(string) bool, a *Assignments) {
	f.calls++
	f.node, f.offered, f.allocated = n, offered, a.Allocated()
}

// TestRunFollowsSampler: Run runs a cycle for every snapshot the sampler
// signals and stops with its context.
func TestRunFollowsSampler(t *testing.T) {
	r := newRig(t, true)
	r.kubelet.Set()
	r.host.checkpoint()
	updated := r.tr.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.tr.Run(ctx) }()
	for i := range 3 {
		r.samples.publish(gpuSample(gpu0, 500, 500))
		<-updated
		if n := r.kubelet.Calls(); n < i+1 {
			t.Errorf("after %d snapshots: %d List calls", i+1, n)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestNewTrackerRejects(t *testing.T) {
	if _, err := NewTracker(Config{}, Options{}); err == nil || !strings.Contains(err.Error(), "no NVML sampler") {
		t.Errorf("NewTracker without a sampler: %v", err)
	}
	_, err := NewTracker(Config{Zombies: ZombiesConfig{Action: "shoot"}}, Options{Samples: newFakeSamples()})
	if err == nil || !strings.Contains(err.Error(), `health.zombies.action "shoot"`) {
		t.Errorf("NewTracker with a bad action: %v", err)
	}
}

// TestWithHealthMonitor: the check's observations drive the real health
// monitor: the GPU is unhealthy once the zombie has lasted the grace (its
// MIG-less neighbour is not), and once the memory is freed the cause is
// cleared and recovers through the normal recovery period, not held until
// a reset.
func TestWithHealthMonitor(t *testing.T) {
	mon, err := health.NewMonitor(health.Config{}, nil, testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	mon.SetNode(testNode())
	r := newRig(t, true, func(_ *Config, o *Options) { o.Health = mon })
	r.trainRunning()
	r.host.proc(4242, 77001, "python3", "S", podCgroup(uidTrain))
	busy := []nvmlowner.Sample{gpuSample(gpu0, 30000, 500, nvmlProc(4242, 29000)), gpuSample(gpu1, 500, 500)}
	r.cycle(busy...)
	r.trainDeleted()
	r.cycle(busy...)
	if !mon.Healthy(gpu0) {
		t.Fatal("GPU unhealthy before the grace")
	}
	r.clock.Step(DefaultGrace)
	r.cycle(busy...)
	if mon.Healthy(gpu0) {
		t.Fatal("GPU with a zombie healthy after the grace")
	}
	if !mon.Healthy(gpu1) {
		t.Error("the other GPU is unhealthy")
	}
	st := mon.Status(gpu0)
	if reasons := strings.Join(st.Reasons, "; "); !strings.Contains(reasons, "zombie process pid 4242") || strings.Contains(reasons, "held") {
		t.Errorf("GPU reasons %q, want the zombie, not held", reasons)
	}
	if f := mon.Fitness(); f.Fit || f.Reason != health.CheckGPUProcesses {
		t.Errorf("node fitness %+v, want unfit for gpu-processes", f)
	}
	r.host.killProc(4242)
	r.cycle(gpuSample(gpu0, 500, 500), gpuSample(gpu1, 500, 500))
	if reasons := strings.Join(mon.Status(gpu0).Reasons, "; "); !strings.Contains(reasons, "(cleared, recovering)") {
		t.Errorf("GPU reasons after the memory was freed %q, want the cause cleared and recovering", reasons)
	}
}

// TestRestartKeepsPendingCause: after a restart the monitor restores a
// zombie cause from its state file; the tracker's first cycles see the
// zombie again but pending (its grace restarts): the cause is not
// cleared meanwhile, only confirmed once the grace has passed. Classes
// with nothing pending are cleared at once.
func TestRestartKeepsPendingCause(t *testing.T) {
	r := newRig(t, true)
	r.kubelet.Set()
	r.host.checkpoint()
	r.host.proc(4242, 77001, "python3", "D", hostCgroup)
	restored := health.Observation{DeviceID: gpu1, Check: health.CheckGPUProcesses, Key: string(ClassZombie), Fatal: true,
		Reason: "zombie process pid 4242 holds GPU memory"}
	r.health.Observe(restored) // what the state file brought back
	s := gpuSample(gpu1, 8500, 500, nvmlProc(4242, 8000))
	r.cycle(s)
	r.clock.Step(time.Minute)
	r.cycle(s)
	if r.health.reason(gpu1, ClassZombie) == "" {
		t.Fatal("the restored zombie cause was cleared while the zombie is still there")
	}
	if r.health.reason(gpu1, ClassLeaked) != "" {
		t.Error("leaked reported")
	}
	var clearedLeaked bool
	for _, o := range r.health.observations() {
		clearedLeaked = clearedLeaked || (o.DeviceID == gpu1 && o.Key == string(ClassLeaked) && o.Cleared)
	}
	if !clearedLeaked {
		t.Error("no Cleared for a class with nothing pending")
	}
	r.clock.Step(time.Minute)
	r.cycle(s)
	if got := r.health.reason(gpu1, ClassZombie); !strings.Contains(got, "pid 4242") {
		t.Errorf("zombie reason after the grace = %q", got)
	}
	r.host.killProc(4242)
	r.cycle(gpuSample(gpu1, 500, 500))
	if got := r.health.reason(gpu1, ClassZombie); got != "" {
		t.Errorf("zombie not cleared once gone: %q", got)
	}
}

package agent

import (
	"context"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// GPUResetter is hardware that resets GPUs its own way (a simulated
// node: reset success, failure and hang as its faults say); real
// hardware is reset with remediation.reset.command (nvidia-smi).
type GPUResetter interface {
	GPUResetter() remediate.Resetter
}

// newRemediator builds the remediation loop (nil when no step is
// enabled, or without the API server it needs).
func (a *Agent) newRemediator() (*remediate.Remediator, error) {
	if !a.cfg.Remediation.Enabled() || a.node == nil || a.node.Remediation() == nil {
		return nil, nil
	}
	opts := remediate.Options{
		Health:      a.mon,
		Cluster:     a.node.Remediation(),
		Node:        func() *topology.Node { return a.rec.current().node },
		Assignments: a.tracker.Assignments,
		Processes:   a.gpuProcesses,
		Changes:     []<-chan struct{}{a.tracker.Subscribe()},
		HostRoot:    a.hw.HostRoot(),
		Logger:      a.log.With("component", "remediation"),
		Registerer:  a.reg,
	}
	// The agent's own NVML session is let go of for each reset; calls in
	// flight get twice the call timeout to end.
	owner := a.hw.Owner()
	if owner != nil {
		wait := 2 * owner.CallTimeout()
		opts.ReleaseNVML = func(ctx context.Context) (func(), error) { return owner.Release(ctx, wait) }
	}
	if r, ok := a.hw.(GPUResetter); ok {
		opts.Resetter = r.GPUResetter()
	}
	return remediate.New(a.cfg.Remediation, opts)
}

// gpuProcesses is how many processes NVML listed on GPU uuid (its MIG
// devices included) in the latest sample; known is false when the lists
// were not read or the GPU was not sampled.
func (a *Agent) gpuProcesses(uuid string) (int, bool) {
	snap := a.sampler.Latest()
	if snap == nil {
		return 0, false
	}
	for _, s := range snap.Samples {
		if s.UUID == uuid {
			if s.Err != nil || s.ProcessesRead.Status != nvmlowner.OK {
				return 0, false
			}
			return len(s.Processes), true
		}
	}
	return 0, false
}

// drainDevices are the devices whose pods the remediation drains (a GPU
// that needs a reset, its MIG devices, with remediation.drain on and not
// a dry run): served through DRA, their device taint is NoExecute, so the
// scheduler's device-taint eviction controller evicts the claims' pods as
// the Eviction API evicts the device plugin's.
func (a *Agent) drainDevices(n *topology.Node) map[string]bool {
	d := a.cfg.Remediation.Drain
	if !d.Enabled || d.DryRun || n == nil {
		return nil
	}
	out := map[string]bool{}
	for _, rm := range a.mon.Remedies() {
		if rm.Action != health.ActionResetGPU {
			continue
		}
		out[rm.Device], out[rm.GPU] = true, true
		for _, g := range n.GPUs {
			if g.UUID == rm.GPU {
				for _, m := range g.MIG {
					out[m.UUID] = true
				}
			}
		}
	}
	return out
}

// Package simhw is a simulated node (package sim) as the agent's hardware,
// for the simulator build of gpu-node-agent, the demo and tests. The
// product binary never imports it.
package simhw

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/runcmd"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Options configures Open.
type Options struct {
	// Model is the node to simulate (sim.Profile or a topology snapshot).
	Model *topology.Node
	// Name names the node for people ("dgx-h100", "snapshot a.json").
	Name string
	// HostRoot is where the simulated /sys and /dev are written; "" or "/"
	// writes them into a new temporary directory that Close removes (never
	// over the real ones).
	HostRoot string
	// NVML configures the NVML owner over the simulated library.
	NVML nvmlowner.Config
	// ControlAddress is the loopback address of the simulator's control
	// endpoint, served by Run; empty serves none.
	ControlAddress string
	// StartFaults are injected before NVML is first initialised, as if
	// the node had booted with them. With one that fails NVML's init
	// (nvml-failure) Open does not fail: like the real library, the
	// hardware logs it and every Discover tries the init again.
	StartFaults []sim.Fault
	Logger      *slog.Logger
}

// Hardware is a simulated node behind the NVML owner, as the real NVML is
// (nvmlowner.Hardware), plus the simulator's layout-change signal and
// control endpoint. It implements agent.Hardware, agent.Changer,
// agent.Runner and agent.Simulator.
type Hardware struct {
	*nvmlowner.Hardware
	node    *sim.Node
	name    string
	control string
	log     *slog.Logger
	// tmp is the temporary host root Close removes, if any.
	tmp string
}

// Open writes the simulated node under the host root and initialises NVML
// on it. Errors are configuration errors (a model the simulator refuses);
// on error nothing is left behind.
func Open(opts Options) (_ *Hardware, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Hardware{name: opts.Name, control: opts.ControlAddress, log: log}
	root := opts.HostRoot
	if root == "" || root == "/" {
		if root, err = os.MkdirTemp("", "gpu-node-agent-sim-"); err != nil {
			return nil, fmt.Errorf("simulate: host root: %w", err)
		}
		h.tmp = root
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("simulate: host root: %w", err)
	}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if h.node, err = sim.New(opts.Model, root, log.With("component", "sim")); err != nil {
		return nil, err
	}
	for _, f := range opts.StartFaults {
		if err := h.node.InjectFault(f); err != nil {
			return nil, fmt.Errorf("simulate: start fault %s: %w", f.Kind, err)
		}
	}
	owner := nvmlowner.New(h.node.NVML(), opts.NVML, log.With("component", "nvml"))
	h.Hardware = nvmlowner.NewHardware(owner, root, log)
	if err := h.Init(); err != nil && len(opts.StartFaults) == 0 {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	return h, nil
}

// Node is the simulated node (fault injection, MIG changes, its spec).
func (h *Hardware) Node() *sim.Node { return h.node }

// String names the hardware for people: "simulated dgx-h100".
func (h *Hardware) String() string { return "simulated " + h.name }

// Simulated says the /dev paths are under the host root.
func (h *Hardware) Simulated() bool { return true }

// SignalProcess signals one of the simulated node's GPU processes (the
// agent's ProcessSignaller): they exist only in the simulator, so a kill
// of the GPU process check never reaches a real process of this machine.
func (h *Hardware) SignalProcess(pid uint32, sig syscall.Signal) error {
	return h.node.SignalProcess(pid, sig)
}

// WrapPreflightCommand is the preflight's command as the simulated node
// runs it (the agent's CommandWrapper): its command-fail and command-slow
// faults.
func (h *Hardware) WrapPreflightCommand(args []string) []string { return h.node.PreflightCommand(args) }

// Changed is signalled when the simulated layout changes (a MIG change).
func (h *Hardware) Changed() <-chan struct{} { return h.node.Changed() }

// Run serves the simulator's control endpoint until ctx is done; without a
// control address it returns at once.
func (h *Hardware) Run(ctx context.Context) error {
	if h.control == "" {
		return nil
	}
	return sim.ServeControl(ctx, h.control, h.node.ControlHandler(), h.log.With("component", "sim"))
}

// Close shuts NVML down and removes a temporary host root.
func (h *Hardware) Close() {
	if h.Hardware != nil {
		h.Hardware.Close()
	}
	if h.tmp != "" {
		os.RemoveAll(h.tmp)
	}
}

// GPUResetter resets the simulated node's GPUs (the agent's GPUResetter):
// a reset that works changes the simulator's state as nvidia-smi -r
// changes the driver's; a failing or hanging one (the reset-fail and
// reset-hang faults) runs a shell that fails or never ends through the
// real exec path, so its timeout and kill are the real ones.
func (h *Hardware) GPUResetter() remediate.Resetter { return simResetter{h.node} }

type simResetter struct{ node *sim.Node }

func (s simResetter) Reset(ctx context.Context, g topology.GPU, timeout time.Duration) (bool, error) {
	i := s.node.GPUIndex(g.UUID)
	if i < 0 {
		return false, fmt.Errorf("gpu %s: not on the simulated node", g.UUID)
	}
	var script string
	switch s.node.ResetOutcome(i) {
	case "hang":
		script = "sleep 3600"
	case "fail":
		script = fmt.Sprintf("echo 'Unable to reset GPU %s: Unknown Error (simulated: sim fault %s)' >&2; exit 255", g.PCIBusID, sim.FaultResetFail)
	default:
		if err := s.node.ResetGPU(i); err != nil {
			return false, fmt.Errorf("nvidia-smi -r -i %s: %w", g.PCIBusID, err)
		}
		return false, nil
	}
	r := runcmd.Run(ctx, "nvidia-smi -r -i "+g.PCIBusID, []string{"/bin/sh", "-c", script}, nil, timeout, remediate.DefaultResetOutputBytes)
	return r.TimedOut, r.Err
}

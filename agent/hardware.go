package agent

import (
	"context"
	"fmt"
	"syscall"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Hardware is where the agent finds its devices: the NVML owner every NVML
// consumer calls through, and discovery. *nvmlowner.Hardware is the real
// one; a simulated node (agent/simhw) is another. Optional behaviour is
// found by interface assertion: fmt.Stringer names the hardware for people
// ("NVML" otherwise), Changer signals layout changes, Runner runs a part of
// its own beside the agent's, and Simulator says /dev lies under the host
// root.
type Hardware interface {
	// Owner is the only NVML caller.
	Owner() *nvmlowner.Owner
	// HostRoot is where the host's / is mounted: /sys, /dev and the
	// kubelet's sockets are read under it.
	HostRoot() string
	// Discover reads the node's current topology (GPUs, MIG, links).
	Discover() (*topology.Node, error)
	// LastNode is the last discovered node, nil if the last discovery
	// failed.
	LastNode() *topology.Node
	// Close releases the hardware (NVML Shutdown).
	Close()
}

// Changer is hardware that signals its own layout changes (the
// simulator's MIG changes), rediscovered at once; real hardware is
// rescanned on a timer and on Rescan instead.
type Changer interface {
	Changed() <-chan struct{}
}

// Runner is hardware with a long-running part of its own (the simulator's
// control endpoint), run beside the agent's parts for as long as they run.
type Runner interface {
	Run(ctx context.Context) error
}

// Simulator is hardware that is a simulated node: the /dev paths handed
// to containers are under its host root, there is no netlink, and the GPU
// processes NVML lists are the simulator's (their /proc files are under
// its host root too).
type Simulator interface {
	Simulated() bool
}

// ProcessSignaller is hardware whose GPU processes it signals itself (a
// simulated node: its processes exist only in the simulator). The GPU
// process check's kills (health.zombies.action kill) go to it, after the
// PID's start time is checked against the one observed; without it
// simulated processes are never killed, and real ones are killed through
// a pidfd.
type ProcessSignaller interface {
	SignalProcess(pid uint32, sig syscall.Signal) error
}

// CommandWrapper is hardware that changes how the preflight's command is
// run (a simulated node's command faults: a command that fails or starts
// late, run through the real exec path).
type CommandWrapper interface {
	WrapPreflightCommand(args []string) []string
}

func describe(hw Hardware) string {
	if s, ok := hw.(fmt.Stringer); ok {
		return s.String()
	}
	return "NVML"
}

func changed(hw Hardware) <-chan struct{} {
	if c, ok := hw.(Changer); ok {
		return c.Changed()
	}
	return nil
}

func simulated(hw Hardware) bool {
	s, ok := hw.(Simulator)
	return ok && s.Simulated()
}

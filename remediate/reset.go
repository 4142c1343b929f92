package remediate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/runcmd"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Resetter resets one GPU through the driver. ExecResetter is the real
// one; a simulated node brings its own.
type Resetter interface {
	// Reset resets g within timeout. A nil error means the driver reset
	// it; timedOut says the reset did not end in time (it was killed).
	Reset(ctx context.Context, g topology.GPU, timeout time.Duration) (timedOut bool, err error)
}

// ExecResetter resets a GPU with the driver's own tool, as NVIDIA's
// documentation (nvidia-smi(1), -r/--gpu-reset) and its NVSentinel
// gpu-reset job do:
//
//  1. read the GPU's persistence mode (--query-gpu=persistence_mode);
//  2. if it is on, turn it off (-pm 0): persistence mode counts as an
//     attachment to the GPU (nvml.h, nvmlDeviceRemoveGpu_v2), and the
//     reset is refused ("In use by another client") while it is on;
//  3. nvidia-smi -r -i <PCI bus ID>;
//  4. turn persistence mode back on if it was on, whatever the reset did.
//
// Every step runs without a shell, in its own process group, within what
// is left of the timeout (internal/runcmd).
type ExecResetter struct {
	// Command is the tool and its leading arguments (ResetConfig.Command).
	Command []string
}

// Reset implements Resetter.
func (e ExecResetter) Reset(ctx context.Context, g topology.GPU, timeout time.Duration) (bool, error) {
	if g.PCIBusID == "" {
		return false, fmt.Errorf("gpu %s: PCI bus ID unknown", g.UUID)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	run := func(args ...string) runcmd.Result {
		full := append(slices.Clone(e.Command), args...)
		left := timeout
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		return runcmd.Run(ctx, strings.Join(full, " "), full, nil, max(left, time.Millisecond), DefaultResetOutputBytes)
	}
	q := run("--query-gpu=persistence_mode", "--format=csv,noheader", "-i", g.PCIBusID)
	if q.Err != nil {
		return q.TimedOut, fmt.Errorf("read persistence mode: %w", q.Err)
	}
	persistent := strings.EqualFold(strings.TrimSpace(q.Output), "Enabled")
	if persistent {
		if r := run("-pm", "0", "-i", g.PCIBusID); r.Err != nil {
			return r.TimedOut, fmt.Errorf("turn persistence mode off for the reset: %w", r.Err)
		}
	}
	r := run("-r", "-i", g.PCIBusID)
	if persistent {
		// Restore even after a failed reset, with a fresh bound: the
		// reset may have used up the timeout.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		full := append(slices.Clone(e.Command), "-pm", "1", "-i", g.PCIBusID)
		p := runcmd.Run(rctx, strings.Join(full, " "), full, nil, time.Minute, DefaultResetOutputBytes)
		rcancel()
		if p.Err != nil && r.Err == nil {
			return false, fmt.Errorf("gpu reset, but persistence mode not turned back on: %w", p.Err)
		}
	}
	return r.TimedOut, r.Err
}

// FabricManagerRunning reports whether NVIDIA Fabric Manager
// (nv-fabricmanager) runs on the host: a process of that name under
// <hostRoot>/proc. It needs the host's PID namespace (or its /proc).
func FabricManagerRunning(hostRoot string) bool {
	dirs, err := os.ReadDir(filepath.Join(hostRoot, "proc"))
	if err != nil {
		return false
	}
	for _, d := range dirs {
		if d.Name()[0] < '0' || d.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join(hostRoot, "proc", d.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(b)) == "nv-fabricmanager" {
			return true
		}
	}
	return false
}

// resetUnsafe says why GPU g of node n may not be reset on its own, ""
// when it may, following nvidia-smi(1) on -r and NVIDIA's MIG user guide:
//   - a vGPU guest: "GPU reset is not allowed via the hypervisor";
//   - an architecture before Ampere with NVLink peers: "any GPUs with
//     NVLink connections to a GPU being reset must also be reset in the
//     same command", which would take healthy GPUs away too;
//   - Ampere on an NVSwitch system without Fabric Manager running: "On
//     Ampere NVSwitch systems, Fabric Manager is required to facilitate
//     reset" (Hopper and later: "the dependency on Fabric Manager ... is
//     removed");
//   - an unknown architecture (compute capability not read): the rules
//     above cannot be applied;
//   - MIG devices configured, unless allowMIG: "the user or system
//     administrator needs to recreate the desired MIG configurations if
//     the GPU or system is reset".
func resetUnsafe(g topology.GPU, n *topology.Node, allowMIG bool, fabricManager func() bool) string {
	if n.Host.VGPU != nil && n.Host.VGPU.Present {
		return "the node is a vGPU guest: NVIDIA does not support GPU reset there"
	}
	if g.ComputeMajor == 0 {
		return "its architecture is unknown (compute capability not read), so NVIDIA's reset rules cannot be applied"
	}
	var peers []string
	for _, l := range n.Links {
		if l.NVLinks == 0 || l.A == l.B || (l.A != g.Index && l.B != g.Index) {
			continue
		}
		peer := l.A
		if peer == g.Index {
			peer = l.B
		}
		peers = append(peers, fmt.Sprint(peer))
	}
	if g.ComputeMajor < 8 && len(peers) > 0 {
		return fmt.Sprintf("before Ampere, a GPU must be reset together with its NVLink peers (GPUs %s); the agent resets one GPU at a time", strings.Join(peers, ", "))
	}
	if g.ComputeMajor == 8 && len(peers) > 0 && topology.NVSwitched(n) && !fabricManager() {
		return "on an Ampere NVSwitch system the reset needs Fabric Manager, and no nv-fabricmanager process runs"
	}
	if len(g.MIG) > 0 && !allowMIG {
		return fmt.Sprintf("it has %d MIG devices, which a reset destroys (set remediation.reset.allowMIG to reset anyway and have the MIG manager recreate them)", len(g.MIG))
	}
	return ""
}

package sim

import "github.com/NVIDIA/go-nvml/pkg/nvml"

// resetGPU leaves GPU i as NVML shows it after a GPU reset (nvidia-smi -r,
// nvmlDeviceResetGpu): the driver tears the GPU down and initialises it
// again, as when it loads.
//
//   - Volatile ECC counts go back to zero: nvml.h nvmlEccCounterType_t,
//     NVML_VOLATILE_ECC "Volatile counts are reset each time the driver
//     loads"; aggregate counts do not (NVML_AGGREGATE_ECC "Aggregate counts
//     persist across reboots (i.e. for the lifetime of the device)"). The
//     simulator counts no single-bit errors, so only DBE has a count.
//   - A pending page retirement completes: nvml.h
//     nvmlDeviceGetRetiredPagesPendingStatus, pages "pending retirement and
//     need a reboot to fully retire"; the page stays in the retired list
//     (nvmlDeviceGetRetiredPages_v2 lists pending pages already).
//   - A pending row remap is carried out: nvml.h nvmlDeviceGetRemappedRows,
//     "A reset will be required to actually remap the row", so the row
//     counts as remapped; "failureOccurred will be set if a row remapping
//     ever failed in the past", so a remap failure stays.
//   - A lost or hung GPU answers again, and NVLinks the faults took down
//     train again.
//   - FI_DEV_GET_GPU_RECOVERY_ACTION reads NVML_GPU_RECOVERY_ACTION_NONE
//     ("No action needed") again.
//
// A GPU NVML does not list (gpu-missing) stays unlisted and a fabric that is
// not ready stays so: neither is the GPU's own state.
func (n *Node) resetGPU(i int) {
	fs := n.faults
	fs.mu.Lock()
	g := &fs.gpus[i]
	g.volatileDBE = 0
	if g.retiredPending {
		g.retiredPages = append(g.retiredPages, pageAddress(len(g.retiredPages)))
		g.retiredPending = false
	}
	if g.remapPending {
		g.remappedUnc++
		g.remapPending = false
	}
	g.recovery = nvml.GPU_RECOVERY_ACTION_NONE
	fs.mu.Unlock()

	n.mu.Lock()
	gs := n.gpus[i]
	gs.lost = false
	n.spec.GPUs[i].Lost = false
	for l := range gs.links {
		gs.links[l].down = false
	}
	n.mu.Unlock()
	n.gates[i].setHang(false)
}

// resetIdleGPU resets GPU i as resetGPU does, and frees the memory leaked
// on it (the driver initialises the GPU's memory again), if no simulated
// process holds a context on it: a reset of a GPU in use is refused
// (nvidia-smi -r: the GPU is in use; NVML_ERROR_IN_USE).
func (n *Node) resetIdleGPU(i int) error {
	n.layoutMu.Lock()
	defer n.layoutMu.Unlock()
	if err := n.checkIdle(i, "kind: gpu-reset"); err != nil {
		return err
	}
	n.clearLeaks(i)
	n.resetGPU(i)
	return nil
}

// ResetOutcome is how a reset of GPU i ends, as its faults say: "fail"
// (reset-fail: nvidia-smi exits 255, its "other error"), "hang"
// (reset-hang: the reset never returns) or "" (it works, if the GPU is
// idle).
func (n *Node) ResetOutcome(i int) string {
	fs := n.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	switch g := fs.gpus[i]; {
	case g.resetHang:
		return "hang"
	case g.resetFail:
		return "fail"
	}
	return ""
}

// ResetGPU resets GPU i as a reset that works does (the gpu-reset fault):
// refused while a simulated process holds a context on it.
func (n *Node) ResetGPU(i int) error {
	if err := n.checkGPU(i); err != nil {
		return err
	}
	return n.resetIdleGPU(i)
}

// GPUIndex is the simulator index of the GPU with UUID uuid, -1 if none.
func (n *Node) GPUIndex(uuid string) int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for i, g := range n.spec.GPUs {
		if g.UUID == uuid {
			return i
		}
	}
	return -1
}

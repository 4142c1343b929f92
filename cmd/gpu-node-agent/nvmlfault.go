package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/health"
)

// nvmlMissingKey is the cause key of the node fault "NVIDIA GPUs on the PCI
// bus but NVML does not load".
const nvmlMissingKey = "missing-with-gpus"

// noteNVML makes a node whose PCI bus has NVIDIA GPUs but whose NVML does
// not load unfit (tainted, every device unhealthy) instead of a quietly
// empty one; the health monitor alone treats "no library, no GPUs" as a
// node without GPUs. The fault clears once discovery works again.
func noteNVML(mon *health.Monitor, hw *hardware, err error) {
	if hw.sim != nil {
		return
	}
	o := health.Observation{DeviceID: health.NodeID, Check: health.CheckNVML, Key: nvmlMissingKey}
	if errors.Is(err, errNVMLUnavailable) {
		n := nvidiaGPUsOnPCI(hw.hostRoot)
		if n == 0 {
			return
		}
		o.Fatal = true
		o.Reason = "nvml unavailable with NVIDIA GPUs on the PCI bus"
	} else {
		o.Cleared = true
	}
	mon.Observe(o)
}

// nvidiaGPUsOnPCI counts NVIDIA (vendor 0x10de) display and 3D controllers
// (class 0x0300xx, 0x0302xx) in root's /sys/bus/pci/devices.
func nvidiaGPUsOnPCI(root string) int {
	dirs, _ := filepath.Glob(filepath.Join(root, "sys/bus/pci/devices/*"))
	n := 0
	for _, d := range dirs {
		vendor, _ := os.ReadFile(filepath.Join(d, "vendor"))
		class, _ := os.ReadFile(filepath.Join(d, "class"))
		c := strings.TrimSpace(string(class))
		if strings.TrimSpace(string(vendor)) == "0x10de" && (strings.HasPrefix(c, "0x0300") || strings.HasPrefix(c, "0x0302")) {
			n++
		}
	}
	return n
}

package health

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/internal/sysfsattr"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// nvidiaVendor is NVIDIA's PCI vendor ID.
const nvidiaVendor = 0x10de

// PCI class codes (base class, subclass) of GPUs: a VGA-compatible display
// controller (0x0300) and a 3D controller (0x0302), which is what data
// centre GPUs report. Other NVIDIA functions (the NVSwitch bridge 0x0680,
// audio 0x0403, the 0x0380 "other display controller") are not GPUs NVML
// lists.
const (
	classVGA = 0x0300
	class3D  = 0x0302
)

// GPUsOnPCI returns the bus IDs ("0000:3b:00.0", sorted) of the NVIDIA GPUs
// in hostRoot's /sys/bus/pci/devices. A missing directory is no GPUs (a
// container without the host's sysfs); any other read error is returned.
// Devices whose vendor or class file cannot be read are skipped: the check
// must never invent a GPU.
//
// procfs/sysfs.PciDevices is not used: it fails the whole listing when any
// one device lacks one of six files, and needs only two of them.
func GPUsOnPCI(hostRoot string) ([]string, error) {
	dir := filepath.Join(hostRoot, "sys", "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pci devices: %w", err)
	}
	var out []string
	for _, e := range entries {
		// The class only of NVIDIA's functions: a GPU node has hundreds.
		vendor, err := sysfsattr.Hex(filepath.Join(dir, e.Name(), "vendor"))
		if err != nil || vendor != nvidiaVendor {
			continue
		}
		class, err := sysfsattr.Hex(filepath.Join(dir, e.Name(), "class"))
		if err != nil {
			continue
		}
		// class is 0xBBSSPP: base class, subclass, programming interface.
		if c := class >> 8; c == classVGA || c == class3D {
			out = append(out, topology.NormalizeBusID(e.Name()))
		}
	}
	slices.Sort(out)
	return out, nil
}

// MissingGPUs is the gpu-missing check: it compares the NVIDIA GPUs on the
// PCI bus (onBus, from GPUsOnPCI) and cfg.ExpectedGPUs with the GPUs NVML
// lists (node, nil when discovery failed, e.g. NVML does not load), and
// returns a node-wide observation: Fatal when a GPU is missing, Cleared
// otherwise.
//
// A GPU that falls off NVML's list (a driver that failed to initialise it,
// or one that fell off after an XID 79) is invisible to every per-GPU
// check: without this the node would look fit with one GPU less. A GPU NVML
// lists without a bus ID (lost before it could be read) may be any of the
// unmatched ones, so those are missing only beyond that number. GPUs NVML
// lists but the bus does not show (no host sysfs) are not a fault.
//
// With the check disabled only the NVML-does-not-load case remains, as the
// nvml check, which cannot be disabled, used to report it.
func MissingGPUs(cfg Config, onBus []string, node *topology.Node) Observation {
	o := Observation{DeviceID: NodeID, Kind: KindNode, Check: CheckMissing}
	if node == nil {
		if len(onBus) == 0 {
			o.Cleared = true
			return o
		}
		o.Fatal = true
		o.Reason = fmt.Sprintf("nvml unavailable with NVIDIA GPUs on the PCI bus (%s)", strings.Join(onBus, ", "))
		return o
	}
	if !cfg.enabled(CheckMissing) {
		o.Cleared = true
		return o
	}
	listed := map[string]bool{}
	unresolved := 0
	for _, g := range node.GPUs {
		if g.PCIBusID == "" {
			unresolved++
			continue
		}
		listed[topology.NormalizeBusID(g.PCIBusID)] = true
	}
	var reasons []string
	var missing []string
	for _, b := range onBus {
		if !listed[topology.NormalizeBusID(b)] {
			missing = append(missing, b)
		}
	}
	if len(missing) > unresolved {
		for _, b := range missing {
			reasons = append(reasons, fmt.Sprintf("gpu %s on the PCI bus is not listed by NVML", b))
		}
	}
	if n := len(node.GPUs); cfg.ExpectedGPUs > 0 && n < cfg.ExpectedGPUs {
		reasons = append(reasons, fmt.Sprintf("expected %d gpus, NVML lists %d", cfg.ExpectedGPUs, n))
	}
	if len(reasons) == 0 {
		o.Cleared = true
		return o
	}
	o.Fatal = true
	o.Reason = strings.Join(reasons, "; ")
	return o
}

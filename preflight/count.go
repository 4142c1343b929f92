package preflight

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// checkGPUCount: the NVIDIA GPUs on the PCI bus, the GPUs NVML lists and
// the expected count agree. A GPU the driver failed to bring up stays on
// the bus but not in NVML; a GPU that fell off the bus at boot is in
// neither, and only the expected count catches it.
func checkGPUCount(cfg Config, in *Inputs) Result {
	r := Result{Item: ItemGPUCount, Target: "node"}
	expected, from := in.ExpectedGPUs, "the node label"
	if cfg.GPUCount.Label != "" {
		from = "label " + cfg.GPUCount.Label
	}
	if expected == 0 {
		expected, from = cfg.GPUCount.Expected, "preflight.gpuCount.expected"
	}
	var problems []string
	if in.ExpectedGPUsErr != nil {
		problems = append(problems, in.ExpectedGPUsErr.Error())
	}
	switch {
	case in.BusErr != nil:
		problems = append(problems, fmt.Sprintf("the PCI bus could not be read: %v", in.BusErr))
	case len(in.BusGPUs) == 0 && in.Node != nil && len(in.Node.GPUs) > 0:
		problems = append(problems, "the PCI bus shows no NVIDIA GPU (is the host's /sys under the host root?)")
	}
	if in.Node == nil {
		why := "NVML unavailable"
		if in.NodeErr != nil && !errors.Is(in.NodeErr, nvmlowner.ErrUnavailable) {
			why += ": " + in.NodeErr.Error()
		}
		problems = append(problems, why)
	} else {
		listed := map[string]bool{}
		for _, g := range in.Node.GPUs {
			listed[topology.NormalizeBusID(g.PCIBusID)] = true
		}
		var missing []string
		for _, b := range in.BusGPUs {
			if !listed[topology.NormalizeBusID(b)] {
				missing = append(missing, b)
			}
		}
		if len(missing) > 0 {
			problems = append(problems, fmt.Sprintf("on the PCI bus but not in NVML: %s", strings.Join(missing, ", ")))
		}
	}
	nvmlCount := 0
	if in.Node != nil {
		nvmlCount = len(in.Node.GPUs)
	}
	seen := fmt.Sprintf("%d GPUs on the PCI bus, %d in NVML", len(in.BusGPUs), nvmlCount)
	if expected > 0 {
		seen += fmt.Sprintf(", %d expected (%s)", expected, from)
		if len(in.BusGPUs) != expected || nvmlCount != expected {
			problems = append(problems, "not the expected count")
		}
	}
	if len(problems) > 0 {
		r.Status, r.Detail = Fail, seen+": "+strings.Join(slices.Compact(problems), "; ")
		return r
	}
	r.Status, r.Detail = Pass, seen
	return r
}

// ExpectedGPUsFromLabels reads the expected GPU count from the node label
// cfg.GPUCount.Label names: 0 without the label (or without the setting),
// an error naming the label when its value is not a positive count.
func ExpectedGPUsFromLabels(cfg Config, labels map[string]string) (int, error) {
	if cfg.GPUCount.Label == "" {
		return 0, nil
	}
	v, ok := labels[cfg.GPUCount.Label]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("node label %s=%q is not a GPU count (preflight.gpuCount.label)", cfg.GPUCount.Label, v)
	}
	return n, nil
}

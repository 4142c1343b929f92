package gpu

import (
	"fmt"
	"slices"
	"strings"
)

// MIG strategies, as NVIDIA's device plugin defines them.
const (
	// MIGStrategyNone serves every GPU whole as nvidia.com/gpu and ignores
	// MIG devices, even on MIG-enabled GPUs.
	MIGStrategyNone = "none"
	// MIGStrategySingle serves MIG devices as nvidia.com/gpu; every GPU must
	// be MIG-enabled (or none of them) and all MIG devices share one profile.
	MIGStrategySingle = "single"
	// MIGStrategyMixed serves MIG devices as nvidia.com/mig-<profile> and
	// GPUs without MIG as nvidia.com/gpu.
	MIGStrategyMixed = "mixed"
)

// Device-list strategies: how Allocate tells the container runtime which
// devices a container gets.
const (
	// DeviceListEnvvar sets NVIDIA_VISIBLE_DEVICES to the device UUIDs.
	DeviceListEnvvar = "envvar"
	// DeviceListVolumeMounts mounts /dev/null at
	// /var/run/nvidia-container-devices/<uuid> per device, which the NVIDIA
	// container runtime reads instead of the (pod-settable) env var.
	DeviceListVolumeMounts = "volume-mounts"
	// DeviceListCDICRI returns fully-qualified CDI device names
	// (nvidia.com/gpu=<uuid>) in the CDIDevices field of the response.
	DeviceListCDICRI = "cdi-cri"
)

// MIGStrategies lists the valid MIG strategies.
var MIGStrategies = []string{MIGStrategyNone, MIGStrategySingle, MIGStrategyMixed}

// DeviceListStrategies lists the valid device-list strategies.
var DeviceListStrategies = []string{DeviceListEnvvar, DeviceListVolumeMounts, DeviceListCDICRI}

// Config chooses how GPUs become resources and what Allocate returns.
type Config struct {
	// MIGStrategy is one of MIGStrategies; empty means none.
	MIGStrategy string
	// DeviceListStrategy is one of DeviceListStrategies; empty means envvar.
	DeviceListStrategy string
	// PassDeviceSpecs adds the /dev nodes a container needs to Allocate
	// responses, for runtimes that don't inject them themselves. A
	// device's own nodes missing under HostRoot fail the Allocate
	// (FailedPrecondition); absent driver control nodes are left out.
	PassDeviceSpecs bool
	// HostRoot is where the host's / is visible (e.g. /host in a pod); device
	// nodes and /proc/driver files are looked up under it.
	HostRoot string
	// Recorder, if set, is told the GPUs behind every successful Allocate
	// (e.g. *rdma.Recent, so RDMA can prefer NICs near them).
	Recorder AllocationRecorder
	// TimeSlicing, if set, serves the resources it names as time-sliced
	// replicas (sharing.timeSlicing).
	TimeSlicing *TimeSlicing
}

// AllocationRecorder is told the GPU UUIDs just allocated to a container:
// whole GPUs, or the parent GPUs of MIG devices, each once.
type AllocationRecorder interface {
	Record(gpuUUIDs []string)
}

// Validate checks the strategies and the time-slicing section, naming the
// option that is wrong.
func (c Config) Validate() error {
	if c.MIGStrategy != "" && !slices.Contains(MIGStrategies, c.MIGStrategy) {
		return fmt.Errorf("mig-strategy: %q is not one of %s", c.MIGStrategy, strings.Join(MIGStrategies, ", "))
	}
	if c.DeviceListStrategy != "" && !slices.Contains(DeviceListStrategies, c.DeviceListStrategy) {
		return fmt.Errorf("device-list-strategy: %q is not one of %s", c.DeviceListStrategy, strings.Join(DeviceListStrategies, ", "))
	}
	return c.TimeSlicing.Validate(c.MIGStrategy)
}

func (c Config) withDefaults() Config {
	if c.MIGStrategy == "" {
		c.MIGStrategy = MIGStrategyNone
	}
	if c.DeviceListStrategy == "" {
		c.DeviceListStrategy = DeviceListEnvvar
	}
	if c.HostRoot == "" {
		c.HostRoot = "/"
	}
	return c
}

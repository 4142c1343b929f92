package nvmlowner

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// The NVML the owner calls: 69 methods of go-nvml's 540-odd, defined in
// nvmlapi (see there why a package of its own).
type (
	// Library is the library-wide calls: Init, Shutdown, DeviceGetCount,
	// DeviceGetHandleByIndex, DeviceGetHandleByUUID, EventSetCreate,
	// SystemGetDriverVersion, SystemGetCudaDriverVersion, Extensions.
	Library = nvmlapi.Library
	// Device is the calls on a GPU or MIG device handle.
	Device = nvmlapi.Device
	// GpuInstance is the calls on a MIG GPU instance (GetInfo, and the
	// compute instance calls of MIG devices made on demand).
	GpuInstance = nvmlapi.GpuInstance
	// ComputeInstance is the calls on a MIG compute instance (GetInfo,
	// Destroy).
	ComputeInstance = nvmlapi.ComputeInstance
	// EventSet is an NVML event set (Wait, Free).
	EventSet = nvmlapi.EventSet
	// EventData is one event from EventSet.Wait.
	EventData = nvmlapi.EventData
)

// Real is the host's NVML library (go-nvml's nvml.New(), which loads
// libnvidia-ml.so.1 at Init) as a Library.
func Real() Library { return nvmlapi.Wrap(nvml.New()) }

package dra

import (
	"fmt"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// DriverName is the DRA driver name of the agent: one driver, one kubelet
// plugin and one pool per node for GPUs, MIG devices and NICs alike, so a
// single inventory answers a claim that aligns a GPU with a NIC. It names
// the agent rather than one device kind (NVIDIA's driver is gpu.nvidia.com
// because its GPUs and compute domains are separate drivers), sits under
// the domain whose keys the agent already owns (gpu-node-agent.io/unhealthy
// on Nodes), and leaves gpu-node-agent.io itself to labels and taints.
// Unqualified attribute names below live in this domain.
const DriverName = "dra.gpu-node-agent.io"

// Device types, the value of the "type" attribute the DeviceClasses select
// on (the same values NVIDIA's driver uses for GPUs and MIG devices).
const (
	TypeGPU = "gpu"
	TypeMIG = "mig"
	TypeNIC = "nic"
)

// Device names are DNS labels (resource/v1 Device.Name) that stay the same
// across agent restarts, because the kubelet's prepared claims and the
// allocation results on the API server refer to devices by name:
//
//   - GPU: "gpu-<index>", the NVML index (ordered by PCI bus ID, the index
//     nvidia-smi and CUDA_VISIBLE_DEVICES use). NVIDIA's driver uses the
//     /dev/nvidiaN minor instead; on the machines we know the two agree.
//   - MIG: "gpu-<index>-mig-<profile>-<gi>-<ci>", the parent's index, the
//     profile with "." dropped and "+" made "-" (1g.10gb -> 1g10gb,
//     1g.24gb+me.all -> 1g24gb-meall) and NVML's GPU and compute instance
//     IDs. The instance IDs alone make it unique on its parent; the profile
//     makes a name change when a re-layout puts another size under the same
//     IDs, so a stale allocation cannot name the new device. NVIDIA's
//     driver uses the GI profile ID and placement start and size, which our
//     model does not carry.
//   - MIG placement (a MIG device made on demand, Options.OnDemandMIG):
//     "gpu-<index>-mig-<profile>-at-<start>", the parent's index, the
//     profile as above and the placement's first slice. It names a place
//     on the GPU, not an instance: the instance is made when a claim is
//     prepared, so the name holds across makes and restarts. NVIDIA's
//     driver names these "gpu-<minor>-mig-<profile>-<profile ID>-<start>";
//     "-at-" keeps ours apart from the static form above.
//   - NIC: "nic-<rdma device>", lower-cased with "_" made "-" (mlx5_0 ->
//     nic-mlx5-0): the name ibstat, NCCL_IB_HCA and the device plugin's
//     rdma resources use.

// GPUName is the device name of GPU index i.
func GPUName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// MIGName is the device name of MIG device m on GPU index parent.
func MIGName(parent int, m topology.MIGDevice) string {
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", parent, profilePart(m.Profile), m.GPUInstance, m.ComputeInstance)
}

// PlacementName is the device name of the MIG device of profile that
// would sit at placement start on GPU index parent.
func PlacementName(parent int, profile string, start uint32) string {
	return fmt.Sprintf("gpu-%d-mig-%s-at-%d", parent, profilePart(profile), start)
}

// CounterSetName is the shared counter set of GPU index i, whose slices
// and engines its MIG placements consume (NVIDIA's driver names it the
// same way, by minor).
func CounterSetName(index int) string { return fmt.Sprintf("gpu-%d-counter-set", index) }

func profilePart(profile string) string {
	return labelPart(strings.NewReplacer(".", "", "+", "-").Replace(profile))
}

// NICName is the device name of an RDMA device (mlx5_0 -> nic-mlx5-0).
func NICName(rdmaDevice string) string {
	return "nic-" + labelPart(strings.ReplaceAll(rdmaDevice, "_", "-"))
}

// labelPart lower-cases s and drops what a DNS label cannot hold, and
// leading or trailing dashes, so a part joined with "-" keeps the label
// valid. Validation of the whole name is Build's (a part can still make a
// name too long).
func labelPart(s string) string {
	b := make([]byte, 0, len(s))
	for _, c := range []byte(strings.ToLower(s)) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' {
			b = append(b, c)
		}
	}
	return strings.Trim(string(b), "-")
}

// TypeOf is the type (TypeGPU, TypeMIG, TypeNIC) of a device by its name,
// as GPUName, MIGName and NICName make them; "" for a name they do not
// make.
func TypeOf(name string) string {
	switch {
	case strings.HasPrefix(name, "nic-"):
		return TypeNIC
	case !strings.HasPrefix(name, "gpu-"):
		return ""
	case strings.Contains(name, "-mig-"):
		return TypeMIG
	default:
		return TypeGPU
	}
}

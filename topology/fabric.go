package topology

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/uuid"
)

// Fabric is what nvmlDeviceGetGpuFabricInfo says of a GPU's registration
// with the NVLink fabric (nvml.h nvmlGpuFabricInfo_t). A GPU whose NVLinks
// go to NVSwitches (Hopper and later) registers with the Fabric Manager;
// on a multi-node NVLink system (GB200 NVL72 and the like) the registration
// names the NVLink domain, its cluster UUID and clique ID, that the GPUs of
// several nodes share.
type Fabric struct {
	// State is the registration's probe state (NVML_GPU_FABRIC_STATE_*).
	State FabricState `json:"state"`
	// Status is the registration's outcome, an nvmlReturn_t (0
	// NVML_SUCCESS, 27 NVML_ERROR_NOT_READY, ...); nvml.h: "Must be
	// checked only if state returns complete".
	Status uint32 `json:"status,omitempty"`
	// ClusterUUID is the clusterUuid of the cluster the GPU belongs to in
	// the canonical lower-case form ("7b968a6d-c8aa-45e1-9e07-e1e51be99c31",
	// what NVIDIA's GFD writes); empty when NVML reports all 16 bytes zero,
	// as a single-node NVSwitch system (an HGX H100) does.
	ClusterUUID string `json:"clusterUUID,omitempty"`
	// CliqueID is the cliqueId of the fabric clique the GPU belongs to.
	CliqueID uint32 `json:"cliqueID,omitempty"`
}

// FabricState is a GPU's fabric probe state, by the NVML_GPU_FABRIC_STATE_*
// name it stands for; a state nvml.h does not name is its number.
type FabricState string

// Fabric probe states (nvml.h NVML_GPU_FABRIC_STATE_*).
const (
	FabricNotSupported FabricState = "not-supported"
	FabricNotStarted   FabricState = "not-started"
	FabricInProgress   FabricState = "in-progress"
	FabricCompleted    FabricState = "completed"
)

var fabricStates = []struct {
	name  FabricState
	value uint8
}{
	{FabricNotSupported, nvml.GPU_FABRIC_STATE_NOT_SUPPORTED},
	{FabricNotStarted, nvml.GPU_FABRIC_STATE_NOT_STARTED},
	{FabricInProgress, nvml.GPU_FABRIC_STATE_IN_PROGRESS},
	{FabricCompleted, nvml.GPU_FABRIC_STATE_COMPLETED},
}

// FabricStateOf names an nvmlGpuFabricState_t.
func FabricStateOf(v uint8) FabricState {
	for _, s := range fabricStates {
		if s.value == v {
			return s.name
		}
	}
	return FabricState(strconv.Itoa(int(v)))
}

// NVML is the nvmlGpuFabricState_t s names; false when s is neither a
// name FabricStateOf gives nor a number below 256.
func (s FabricState) NVML() (uint8, bool) {
	for _, k := range fabricStates {
		if k.name == s {
			return k.value, true
		}
	}
	v, err := strconv.ParseUint(string(s), 10, 8)
	return uint8(v), err == nil
}

// FabricClusterUUID is the ClusterUUID of NVML's clusterUuid bytes: the
// canonical form google/uuid gives (as GFD's GetFabricIDs formats it), ""
// for all zero bytes.
func FabricClusterUUID(b [nvml.GPU_FABRIC_UUID_LEN]uint8) string {
	u := uuid.UUID(b)
	if u == uuid.Nil {
		return ""
	}
	return u.String()
}

// validate checks a snapshot's fabric fields; p is the GPU's JSON path.
func (f *Fabric) validate(p string) error {
	if f == nil {
		return nil
	}
	if _, ok := f.State.NVML(); !ok {
		return fmt.Errorf("%s.fabric.state: %q is not one of %s, %s, %s, %s (or an nvmlGpuFabricState_t number)",
			p, f.State, FabricNotSupported, FabricNotStarted, FabricInProgress, FabricCompleted)
	}
	if f.ClusterUUID != "" {
		u, err := uuid.Parse(f.ClusterUUID)
		if err != nil || u.String() != f.ClusterUUID || u == uuid.Nil {
			return fmt.Errorf("%s.fabric.clusterUUID: %q is not a non-zero UUID in lower-case 8-4-4-4-12 form (leave it out for none)", p, f.ClusterUUID)
		}
	}
	return nil
}

// clique is the GPU's "<ClusterUUID>.<CliqueID>" when its registration
// completed successfully in a multi-node NVLink domain, else "".
func (f *Fabric) clique() string {
	if f == nil || f.State != FabricCompleted || nvml.Return(f.Status) != nvml.SUCCESS || f.ClusterUUID == "" {
		return ""
	}
	return f.ClusterUUID + "." + strconv.FormatUint(uint64(f.CliqueID), 10)
}

// Clique is the node's multi-node NVLink domain, the value of the
// nvidia.com/gpu.clique label: "<ClusterUUID>.<CliqueID>", the cluster
// UUID in canonical form and the clique ID in decimal, as NVIDIA's
// gpu-feature-discovery writes it. It is "" unless every GPU of the node
// reports its fabric registration completed with success, a non-zero
// cluster UUID, and the same cluster UUID and clique ID as the others.
//
// What NVIDIA's code does, read at NVIDIA/k8s-device-plugin
// 1b826acc6af3079d8923bac395c3124b8861a9a6 (internal/lm/imex.go
// newImexLabeler and getFabricIDs, internal/resource/nvml-device.go
// GetFabricIDs, go-nvlib v0.12.0 pkg/nvlib/device/device.go
// IsFabricAttached) and NVIDIA/k8s-dra-driver-gpu
// 22407113785e78c7763b4637689a201eb39c6199
// (cmd/compute-domain-kubelet-plugin/nvlib.go getCliqueIDStrict):
//
//   - GFD reads every full GPU (never a MIG device: GetFabricIDs "is not
//     supported for MIG devices"), so a GPU in MIG mode counts as its
//     parent; so does Clique.
//   - A GPU answering NOT_SUPPORTED, a state other than COMPLETED, a
//     status other than SUCCESS or an all-zero cluster UUID is "not
//     fabric attached" and skipped; GFD labels the node from the GPUs
//     left. The DRA driver treats the zero cluster UUID the same way:
//     "Expected for systems which are NVLink-capable, but not
//     MNNVL-capable", a single-node NVSwitch system such as a DGX H100,
//     which therefore gets no label.
//   - GPUs that disagree (two cluster UUIDs or two clique IDs): GFD logs a
//     warning and sets no label; the DRA driver's compute-domain kubelet
//     plugin refuses to start.
//   - Any other error from the fabric read fails GFD's whole labelling
//     pass. Here discovery notes it in Node.Unread, so the node's labels
//     are kept as they are (LabelsComplete) rather than recomputed.
//
// Stricter than GFD: one GPU skipped (not registered yet, registration
// failed, no fabric) removes the label rather than leaving the others to
// decide it, so a node carries it only while every GPU can reach the
// NVLink domain the label names.
func Clique(n *Node) string {
	if n == nil || len(n.GPUs) == 0 {
		return ""
	}
	var clique string
	for i := range n.GPUs {
		c := n.GPUs[i].Fabric.clique()
		if c == "" || (clique != "" && c != clique) {
			return ""
		}
		clique = c
	}
	return clique
}

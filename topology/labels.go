package topology

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Node label keys. The nvidia.com ones carry the names and values
// gpu-feature-discovery (GFD, k8s-device-plugin v0.20.0) gives them, so node
// selectors written for GFD keep working; the gpu-node-agent.io ones
// describe wiring GFD does not label.
const (
	LabelGPUProduct         = "nvidia.com/gpu.product"
	LabelGPUCount           = "nvidia.com/gpu.count"
	LabelGPUMemory          = "nvidia.com/gpu.memory" // MiB
	LabelGPUReplicas        = "nvidia.com/gpu.replicas"
	LabelGPUSharingStrategy = "nvidia.com/gpu.sharing-strategy"
	LabelGPUFamily          = "nvidia.com/gpu.family"
	LabelGPUComputeMajor    = "nvidia.com/gpu.compute.major"
	LabelGPUComputeMinor    = "nvidia.com/gpu.compute.minor"
	LabelGPUMachine         = "nvidia.com/gpu.machine"
	LabelGPUMode            = "nvidia.com/gpu.mode"
	LabelMIGCapable         = "nvidia.com/mig.capable"
	LabelMIGStrategy        = "nvidia.com/mig.strategy"
	LabelMPSCapable         = "nvidia.com/mps.capable"
	LabelVGPUPresent        = "nvidia.com/vgpu.present"
	LabelVGPUHostDriver     = "nvidia.com/vgpu.host-driver-version"
	LabelVGPUHostBranch     = "nvidia.com/vgpu.host-driver-branch"
	// LabelGPUClique is the node's multi-node NVLink domain,
	// "<ClusterUUID>.<CliqueID>" (Clique).
	LabelGPUClique = "nvidia.com/gpu.clique"

	LabelNVLink    = "gpu-node-agent.io/nvlink"
	LabelNVSwitch  = "gpu-node-agent.io/nvswitch"
	LabelNUMANodes = "gpu-node-agent.io/numa-nodes"
	// LabelNUMALayout lists GPUs per NUMA node: "0x4.1x4" is four GPUs on
	// NUMA node 0 and four on node 1.
	LabelNUMALayout = "gpu-node-agent.io/gpu-numa-layout"
)

// MIG strategies, as the NVIDIA device plugin and GFD name them.
const (
	MIGStrategyNone   = "none"
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"
)

// gpuResource is the resource name GFD's per-resource labels hang off.
const gpuResource = "nvidia.com/gpu"

// SharingTimeSlicing is GFD's gpu.sharing-strategy for time-sliced
// resources (NVIDIA's api/config/v1 SharingStrategyTimeSlicing).
const SharingTimeSlicing = "time-slicing"

// SharedResource is how one resource is time-sliced, as far as GFD's
// labels tell: the replicas of each device and whether the replicas are
// served under another name (a rename written, or renameByDefault).
type SharedResource struct {
	Replicas int
	Renamed  bool
}

// Sharing is the time-sliced resources by the name of the resource they
// share (nvidia.com/gpu, nvidia.com/mig-<profile>); nil or empty: none.
type Sharing map[string]SharedResource

// Labels returns the node labels that describe n under the given MIG
// strategy ("" is none) with the given time-sliced resources (nil: none).
// A node without GPUs gets no labels. The nvidia.com labels are the ones
// GFD v0.20.0 sets, with its value rules (internal/lm, internal/resource):
//
//   - cuda.driver-version.{major,minor,revision,full} from the driver version
//     and cuda.runtime-version.{major,minor,full} from the CUDA driver
//     version (1000*major + 10*minor), plus the deprecated cuda.driver.* and
//     cuda.runtime.*; none when either version is unknown or the driver's is
//     not X.Y[.Z];
//   - gpu.machine: the DMI product name, "unknown" when unreadable;
//   - mig.capable: any GPU supports MIG; mps.capable "false" (no MPS
//     sharing configured); gpu.mode from the GPUs' PCI class ("compute",
//     "graphics", or "unknown" when they differ or one is unreadable);
//     vgpu.present when the PCI configuration space was read;
//   - gpu.{product,count,replicas,sharing-strategy,memory} and, when the
//     compute capability is known, gpu.{family,compute.major,compute.minor}
//     describe the lowest-index GPU that is not lost and the GPUs of its
//     model; replicas is 1, or 0 when every GPU of that model has MIG
//     enabled (GFD labels those without sharing);
//   - a shared resource (sharing's nvidia.com/gpu for the gpu.* labels,
//     and for the MIG labels under single; nvidia.com/mig-<profile> for
//     that profile's under mixed) has replicas = its replicas,
//     sharing-strategy "time-slicing" and, unless its replicas are renamed,
//     "-SHARED" appended to product (lm/resource.go baseLabeler,
//     getProductName); its count stays the device count;
//   - mig.strategy only under single and mixed. Under single, a node whose
//     MIG-enabled GPUs all hold MIG devices of one profile, and has no GPU
//     without MIG, gets the gpu.* labels of that profile (product
//     "<model>-MIG-<profile>", the MIG device count, memory and attributes);
//     any other node with MIG enabled gets GFD's "<model>-MIG-INVALID" set.
//     Under mixed each profile gets nvidia.com/mig-<profile>.* labels;
//   - gpu.clique: the multi-node NVLink domain every GPU reports (Clique,
//     which says where it is stricter than GFD); none on a node outside
//     one, or while a GPU's fabric registration is not completed.
//
// GFD's optional nvidia.com/gfd.timestamp is not set: it would change the
// Node on every relabel. gpu-node-agent.io/nvswitch is inferred, since the
// node model holds link counts rather than switches: at least three GPUs
// and every pair joined by the same non-zero number of NVLinks — what an
// NVSwitch fabric looks like. A direct full mesh with equal counts would
// read the same.
func Labels(n *Node, migStrategy string, sharing Sharing) map[string]string {
	if len(n.GPUs) == 0 {
		return map[string]string{}
	}
	if migStrategy == "" {
		migStrategy = MIGStrategyNone
	}
	l := map[string]string{}
	addHostLabels(l, n)
	addGPULabels(l, n, sharing)
	if migStrategy != MIGStrategyNone {
		l[LabelMIGStrategy] = migStrategy
		addMIGLabels(l, n, migStrategy, sharing)
	}
	if c := Clique(n); c != "" {
		l[LabelGPUClique] = c
	}
	addWiringLabels(l, n)
	return l
}

// addHostLabels adds the labels of the node as a whole: versions, machine,
// MIG and MPS capability, GPU mode, vGPU.
func addHostLabels(l map[string]string, n *Node) {
	h := n.Host
	if parts := strings.Split(h.DriverVersion, "."); h.CUDADriverVersion > 0 && (len(parts) == 2 || len(parts) == 3) {
		rev := ""
		if len(parts) == 3 {
			rev = parts[2]
		}
		major := strconv.Itoa(h.CUDADriverVersion / 1000)
		minor := strconv.Itoa(h.CUDADriverVersion % 1000 / 10)
		maps.Copy(l, map[string]string{
			"nvidia.com/cuda.driver.major":            parts[0],
			"nvidia.com/cuda.driver.minor":            parts[1],
			"nvidia.com/cuda.driver.rev":              rev,
			"nvidia.com/cuda.runtime.major":           major,
			"nvidia.com/cuda.runtime.minor":           minor,
			"nvidia.com/cuda.driver-version.major":    parts[0],
			"nvidia.com/cuda.driver-version.minor":    parts[1],
			"nvidia.com/cuda.driver-version.revision": rev,
			"nvidia.com/cuda.driver-version.full":     h.DriverVersion,
			"nvidia.com/cuda.runtime-version.major":   major,
			"nvidia.com/cuda.runtime-version.minor":   minor,
			"nvidia.com/cuda.runtime-version.full":    major + "." + minor,
		})
	}
	machine := gfdSanitise(h.MachineType)
	if h.MachineType == "" {
		machine = "unknown"
	}
	l[LabelGPUMachine] = machine
	l[LabelMIGCapable] = strconv.FormatBool(slices.ContainsFunc(n.GPUs, func(g GPU) bool { return g.MIGCapable }))
	l[LabelMPSCapable] = "false"
	l[LabelGPUMode] = gpuMode(n.GPUs)
	if v := h.VGPU; v != nil {
		l[LabelVGPUPresent] = strconv.FormatBool(v.Present)
		if v.Present {
			l[LabelVGPUHostDriver] = labelValue(v.HostDriverVersion)
			l[LabelVGPUHostBranch] = labelValue(v.HostDriverBranch)
		}
	}
}

// PCI classes of a GPU (go-nvlib nvpci.PCIVgaControllerClass,
// PCI3dControllerClass).
const (
	PCIClassVGA          = 0x030000
	PCIClass3DController = 0x030200
)

// gpuMode is GFD's gpu.mode: the one PCI class all GPUs share.
func gpuMode(gpus []GPU) string {
	class := gpus[0].PCIClass
	for _, g := range gpus {
		if g.PCIClass != class || g.PCIClass == 0 {
			return "unknown"
		}
	}
	switch class {
	case PCIClassVGA:
		return "graphics"
	case PCIClass3DController:
		return "compute"
	}
	return "unknown"
}

// reference is the GPU the gpu.* labels describe: the lowest-index GPU
// that is not lost; nil when all are.
func reference(n *Node) *GPU {
	for i := range n.GPUs {
		if !n.GPUs[i].Lost {
			return &n.GPUs[i]
		}
	}
	return nil
}

// sharingLabels are GFD's replicas, sharing-strategy and product labels of
// a resource (lm/resource.go baseLabeler): shared with more than one
// replica, the product gets "-SHARED" unless the replicas are renamed.
func sharingLabels(share SharedResource, productParts ...string) (replicas, strategy, product string) {
	if share.Replicas > 1 {
		if !share.Renamed {
			productParts = append(productParts, "SHARED")
		}
		return strconv.Itoa(share.Replicas), SharingTimeSlicing, productName(productParts...)
	}
	return "1", "none", productName(productParts...)
}

// addGPULabels adds GFD's full-GPU labels (nvidia.com/gpu.*).
func addGPULabels(l map[string]string, n *Node, sharing Sharing) {
	ref := reference(n)
	if ref == nil {
		l[LabelGPUCount] = strconv.Itoa(len(n.GPUs))
		return
	}
	// GFD labels per model name; a GPU lost before its name was read is
	// counted with the reference's model (nodes are homogeneous).
	count, allMIG := 0, true
	for _, g := range n.GPUs {
		if g.Model == ref.Model || (g.Lost && g.Model == "") {
			count++
			if !g.MIGEnabled {
				allMIG = false
			}
		}
	}
	replicas, strategy, product := sharingLabels(sharing[gpuResource], ref.Model)
	if allMIG {
		// GFD labels MIG-enabled GPUs without sharing
		// (NewGPUResourceLabelerWithoutSharing).
		replicas, strategy, product = "0", "none", productName(ref.Model)
	}
	l[LabelGPUProduct] = product
	l[LabelGPUCount] = strconv.Itoa(count)
	l[LabelGPUReplicas] = replicas
	l[LabelGPUSharingStrategy] = strategy
	if ref.MemoryMiB > 0 {
		l[LabelGPUMemory] = strconv.FormatUint(ref.MemoryMiB, 10)
	}
	if ref.ComputeMajor != 0 {
		l[LabelGPUFamily] = ArchFamily(ref.ComputeMajor, ref.ComputeMinor)
		l[LabelGPUComputeMajor] = strconv.Itoa(ref.ComputeMajor)
		l[LabelGPUComputeMinor] = strconv.Itoa(ref.ComputeMinor)
	}
}

// ArchFamily is GFD's gpu.family for a CUDA compute capability.
func ArchFamily(major, minor int) string {
	switch major {
	case 1:
		return "tesla"
	case 2:
		return "fermi"
	case 3:
		return "kepler"
	case 5:
		return "maxwell"
	case 6:
		return "pascal"
	case 7:
		if minor < 5 {
			return "volta"
		}
		return "turing"
	case 8:
		if minor < 9 {
			return "ampere"
		}
		return "ada-lovelace"
	case 9:
		return "hopper"
	case 10, 12:
		return "blackwell"
	case 13:
		return "rubin"
	}
	return "undefined"
}

// migProfile is one MIG profile's devices on the node.
type migProfile struct {
	parentModel string
	count       int
	memoryMiB   uint64
	attrs       MIGAttributes
}

// MIGResourceName is the name GFD and the device plugin give a MIG
// profile's resource: the profile with "+" replaced by "." ("1g.20gb+me"
// is nvidia.com/mig-1g.20gb.me).
func MIGResourceName(profile string) string {
	return "nvidia.com/mig-" + strings.ReplaceAll(profile, "+", ".")
}

// addMIGLabels adds the strategy-specific MIG labels.
func addMIGLabels(l map[string]string, n *Node, strategy string, sharing Sharing) {
	profiles := map[string]*migProfile{}
	var enabled, disabled, empty int
	var firstEnabled *GPU
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if !g.MIGEnabled {
			disabled++
			continue
		}
		enabled++
		if firstEnabled == nil {
			firstEnabled = g
		}
		if len(g.MIG) == 0 {
			empty++
		}
		for _, m := range g.MIG {
			name := strings.ReplaceAll(m.Profile, "+", ".")
			p := profiles[name]
			if p == nil {
				p = &migProfile{parentModel: g.Model, memoryMiB: m.MemoryMiB, attrs: m.Attributes}
				profiles[name] = p
			}
			p.count++
		}
	}
	switch strategy {
	case MIGStrategySingle:
		if enabled == 0 {
			return
		}
		if empty > 0 || disabled > 0 || len(profiles) != 1 {
			// GFD's labels for a node mig-strategy=single cannot serve.
			l[LabelGPUProduct] = productName(firstEnabled.Model, "MIG", "INVALID")
			l[LabelGPUCount] = "0"
			l[LabelGPUReplicas] = "0"
			l[LabelGPUSharingStrategy] = ""
			l[LabelGPUMemory] = "0"
			return
		}
		for name, p := range profiles {
			addMIGResourceLabels(l, gpuResource, name, p, sharing[gpuResource])
		}
	case MIGStrategyMixed:
		for name, p := range profiles {
			addMIGResourceLabels(l, MIGResourceName(name), name, p, sharing[MIGResourceName(name)])
		}
	}
}

// addMIGResourceLabels adds GFD's labels of one MIG profile served as
// resource, shared as share says.
func addMIGResourceLabels(l map[string]string, resource, name string, p *migProfile, share SharedResource) {
	a := p.attrs
	replicas, strategy, product := sharingLabels(share, p.parentModel, "MIG", name)
	for suffix, v := range map[string]string{
		"product":          product,
		"count":            strconv.Itoa(p.count),
		"replicas":         replicas,
		"sharing-strategy": strategy,
		"memory":           strconv.FormatUint(p.memoryMiB, 10),
		"multiprocessors":  strconv.FormatUint(uint64(a.Multiprocessors), 10),
		"slices.gi":        strconv.FormatUint(uint64(a.GPUInstanceSlices), 10),
		"slices.ci":        strconv.FormatUint(uint64(a.ComputeInstanceSlices), 10),
		"engines.copy":     strconv.FormatUint(uint64(a.CopyEngines), 10),
		"engines.decoder":  strconv.FormatUint(uint64(a.Decoders), 10),
		"engines.encoder":  strconv.FormatUint(uint64(a.Encoders), 10),
		"engines.jpeg":     strconv.FormatUint(uint64(a.JPEGs), 10),
		"engines.ofa":      strconv.FormatUint(uint64(a.OFAs), 10),
	} {
		l[resource+"."+suffix] = v
	}
}

// addWiringLabels adds the agent's own labels: NVLink, NVSwitch, NUMA.
func addWiringLabels(l map[string]string, n *Node) {
	nvlink := false
	for _, k := range n.Links {
		if k.NVLinks > 0 {
			nvlink = true
		}
	}
	l[LabelNVLink] = strconv.FormatBool(nvlink)
	l[LabelNVSwitch] = strconv.FormatBool(NVSwitched(n))

	perNUMA := map[int]int{}
	for _, g := range n.GPUs {
		if g.NUMANode >= 0 {
			perNUMA[g.NUMANode]++
		}
	}
	l[LabelNUMANodes] = strconv.Itoa(len(perNUMA))
	if len(perNUMA) > 0 {
		var parts []string
		for _, node := range slices.Sorted(maps.Keys(perNUMA)) {
			parts = append(parts, fmt.Sprintf("%dx%d", node, perNUMA[node]))
		}
		if v := labelValue(strings.Join(parts, ".")); v != "" {
			l[LabelNUMALayout] = v
		}
	}
}

// productName is GFD's product label: each non-empty part sanitised, joined
// with "-" ("NVIDIA H100 80GB HBM3", "MIG", "1g.10gb" is
// "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"), then made a valid label value.
func productName(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, gfdSanitise(p))
		}
	}
	return labelValue(strings.Join(out, "-"))
}

// gfdSanitise is GFD's sanitise: characters other than letters, digits,
// "-", "_", "." and space are dropped, and runs of spaces become one "-".
func gfdSanitise(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if c := s[i]; isAlnum(c) || c == '-' || c == '_' || c == '.' || c == ' ' {
			b = append(b, c)
		}
	}
	return strings.Join(strings.Fields(string(b)), "-")
}

// labelValue makes s a valid label value: GFD's sanitising, then at most
// 63 characters that start and end alphanumeric (a value GFD would write
// longer is refused by the API server). It returns "" when nothing valid
// remains.
func labelValue(s string) string {
	b := []byte(gfdSanitise(s))
	if len(b) > 63 {
		b = b[:63]
	}
	start, end := 0, len(b)
	for start < end && !isAlnum(b[start]) {
		start++
	}
	for end > start && !isAlnum(b[end-1]) {
		end--
	}
	return string(b[start:end])
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// LabelsComplete says whether n was read completely enough for its labels
// to replace the ones on the Node: no GPU lost or unreadable, and nothing
// in Unread. Labels of an incomplete node could drop or change what is
// only momentarily unreadable, so the agent keeps the last complete
// node's labels instead. It returns why not, or "".
func LabelsComplete(n *Node) string {
	if n == nil {
		return "no node discovered"
	}
	for _, g := range n.GPUs {
		if g.Lost {
			return fmt.Sprintf("gpu %d lost (%s)", g.Index, g.LostReason)
		}
	}
	if len(n.Unread) > 0 {
		return "not read: " + strings.Join(n.Unread, "; ")
	}
	return ""
}

// NVSwitched says the node looks like an NVSwitch system: at least three
// GPUs and every pair joined by the same non-zero number of NVLinks (the
// model holds link counts, not switches; a direct full mesh with equal
// counts reads the same).
func NVSwitched(n *Node) bool {
	if len(n.GPUs) < 3 {
		return false
	}
	count, pairs := -1, 0
	for _, k := range n.Links {
		if k.A == k.B {
			continue
		}
		pairs++
		if count == -1 {
			count = k.NVLinks
		}
		if k.NVLinks == 0 || k.NVLinks != count {
			return false
		}
	}
	return pairs == len(n.GPUs)*(len(n.GPUs)-1)/2
}

package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"strings"
)

// The /proc/<pid>/cgroup of a simulated process, as the host's initial
// cgroup namespace shows it, in the formats the kubelet, the container
// runtimes and runc produce. Sources (read for facts, nothing copied):
//
//   - The pod cgroup: kubelet pkg/kubelet/cm (qos_container_manager_linux.go,
//     pod_container_manager_linux.go): Guaranteed pods sit directly under
//     "kubepods", Burstable and BestEffort ones under "kubepods/burstable"
//     and "kubepods/besteffort", each named "pod"+UID. With the systemd
//     driver, cgroup_manager_linux.go's ToSystemd escapes every "-" of a
//     component to "_" and ExpandSlice nests the components as slices:
//     /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice.
//   - The container cgroup: containerd's CRI plugin (getCgroupsPath) puts a
//     container at <pod cgroup>/<container id> under cgroupfs, and asks runc
//     for "<slice>:cri-containerd:<id>" under systemd, which runc makes the
//     scope <pod slice>/cri-containerd-<id>.scope. CRI-O's cgmgr
//     (containerCgroupPath, "crio-"+id) gives <pod cgroup>/crio-<id> under
//     cgroupfs and <pod slice>/crio-<id>.scope under systemd.
//   - crun under the systemd driver on cgroup v2 moves the container's
//     processes into a sub-cgroup "container" of the scope (crun's
//     run.oci.systemd.subgroup annotation: "Defaults to container on cgroup
//     v2, "" on cgroup v1"); runc does not.
//   - cgroup v1 lists one line per hierarchy, the same path on each, and
//     "1:name=systemd:" with it (DataDog datadog-agent pkg/util/cgroups
//     test fixtures, from real kubelet nodes; kubelet/cadvisor docs show the
//     same). On a hybrid host a "0::" line follows; on a containerd node
//     with the cgroupfs driver it names the runtime's service
//     (0::/system.slice/containerd.service, same fixture), since the fs
//     driver does not move the process in the unified hierarchy; with the
//     systemd driver the scope is a systemd unit and systemd places it in
//     the unified hierarchy too, so the 0:: line names the scope.
//   - Host processes: a systemd service (/system.slice/<name>.service) or a
//     login session (/user.slice/user-<uid>.slice/session-<n>.scope).

// Cgroup settings of a simulated process.
const (
	CgroupV1     = "v1"     // legacy hierarchies only
	CgroupV2     = "v2"     // the unified hierarchy: one "0::" line
	CgroupHybrid = "hybrid" // v1 hierarchies plus the unified one

	DriverSystemd  = "systemd"
	DriverCgroupfs = "cgroupfs"

	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "crio"

	OCIRunc = "runc"
	OCICrun = "crun"

	QOSGuaranteed = "guaranteed"
	QOSBurstable  = "burstable"
	QOSBestEffort = "besteffort"
)

// v1Hierarchies are the cgroup v1 hierarchies of a typical kernel 5.x
// node, in the order /proc/<pid>/cgroup lists them (highest ID first), as
// in the datadog-agent fixture; rdma is shown at its root as the kubelet
// does not place pods in it.
var v1Hierarchies = []string{
	"rdma", "memory", "hugetlb", "devices", "perf_event", "cpuset",
	"net_cls,net_prio", "cpu,cpuacct", "blkio", "freezer", "pids", "name=systemd",
}

var (
	// podUIDPattern: a pod UID is an RFC 4122 UUID as the API server
	// generates it, or, for a static pod, the 32 hex digits of the md5
	// hash the kubelet computes (pkg/kubelet/config/common.go).
	podUIDPattern      = regexp.MustCompile(`^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
	containerIDPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// runtimeScheme is the prefix the kubelet shows a runtime's container IDs
// with in a pod's status (containerStatuses[].containerID).
var runtimeScheme = map[string]string{RuntimeContainerd: "containerd://", RuntimeCRIO: "cri-o://"}

// podCgroup is the cgroup path of a container of a pod.
func podCgroup(uid, containerID, qos, driver, runtime, oci, version string) string {
	if driver == DriverCgroupfs {
		parts := []string{"/kubepods"}
		if qos != QOSGuaranteed {
			parts = append(parts, qos)
		}
		parts = append(parts, "pod"+uid)
		if runtime == RuntimeCRIO {
			return path.Join(append(parts, "crio-"+containerID)...)
		}
		return path.Join(append(parts, containerID)...)
	}
	components := []string{"kubepods"}
	if qos != QOSGuaranteed {
		components = append(components, qos)
	}
	components = append(components, "pod"+strings.ReplaceAll(uid, "-", "_"))
	var p, prefix string
	for _, c := range components {
		p += "/" + prefix + c + ".slice"
		prefix += c + "-"
	}
	scope := "cri-containerd-"
	if runtime == RuntimeCRIO {
		scope = "crio-"
	}
	p += "/" + scope + containerID + ".scope"
	if oci == OCICrun && version == CgroupV2 {
		p += "/container"
	}
	return p
}

// cgroupFile is the content of /proc/<pid>/cgroup for a process in cgroup
// p. runtimeService is the unit of the container runtime, named by the
// unified line of a hybrid host under the cgroupfs driver ("" for a host
// process, whose unified line names its own cgroup).
func cgroupFile(p, version string, cgroupfs bool, runtimeService string) string {
	if version == CgroupV2 {
		return "0::" + p + "\n"
	}
	var b strings.Builder
	for i, h := range v1Hierarchies {
		at := p
		if h == "rdma" {
			at = "/"
		}
		fmt.Fprintf(&b, "%d:%s:%s\n", len(v1Hierarchies)-i, h, at)
	}
	if version == CgroupHybrid {
		unified := p
		if cgroupfs && runtimeService != "" {
			unified = "/system.slice/" + runtimeService
		}
		fmt.Fprintf(&b, "0::%s\n", unified)
	}
	return b.String()
}

// derivedID makes a stable identifier of n hex digits from parts, for the
// IDs a spec leaves out (a container ID, the UID of a pod that no longer
// exists).
func derivedID(n int, parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "/")))
	s := hex.EncodeToString(h[:])
	for len(s) < n {
		h = sha256.Sum256([]byte(s))
		s += hex.EncodeToString(h[:])
	}
	return s[:n]
}

// derivedUID is a UUID-shaped pod UID (version 4 layout) derived from parts.
func derivedUID(parts ...string) string {
	h := derivedID(32, parts...)
	return h[0:8] + "-" + h[8:12] + "-4" + h[13:16] + "-8" + h[17:20] + "-" + h[20:32]
}

package usage

import (
	"errors"
	"fmt"
	"strings"
)

// Container runtimes as a cgroup path names them.
const (
	RuntimeContainerd = "containerd" // systemd driver: cri-containerd-<id>.scope
	RuntimeCRIO       = "cri-o"      // crio-<id>.scope, crio-conmon-<id>.scope, cgroupfs crio-<id>
	RuntimeDocker     = "docker"     // docker-<id>.scope (dockershim, cri-dockerd)
)

// Pod QoS classes as the kubelet names their cgroups.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
)

// CgroupInfo is what a process's cgroup membership says about it.
type CgroupInfo struct {
	// PodUID is the UID of the pod whose cgroup holds the process, in
	// the API's form (with dashes); empty for a process outside every
	// pod (a host process, or a container the kubelet does not manage).
	PodUID string
	// QoS is the pod's QoS class (guaranteed, burstable, besteffort).
	QoS string
	// ContainerID is the CRI container ID (64 hex digits) of the
	// container cgroup the process is in; empty when the path names none
	// (a process directly in the pod's cgroup).
	ContainerID string
	// Runtime is the container runtime the container cgroup's name
	// shows; empty when the name does not say (cgroupfs driver with
	// containerd, dockershim or cri-dockerd: the bare ID).
	Runtime string
	// Path is the cgroup path the pod was found in (or the unified
	// hierarchy's, for a process outside every pod).
	Path string
}

// ParseCgroup reads the content of /proc/<pid>/cgroup (cgroups(7): one
// "hierarchy-ID:controller-list:cgroup-path" line per hierarchy; cgroup v2
// is the single line "0::<path>") and finds the pod and container the
// process belongs to. It knows the kubelet's two cgroup drivers:
//
//   - cgroupfs: <root>/kubepods[/burstable|/besteffort]/pod<UID>/<container>,
//     the UID with its dashes;
//   - systemd: <root>/kubepods.slice/kubepods-<qos>.slice/
//     kubepods-<qos>-pod<UID>.slice/<container>.scope, the UID's dashes
//     escaped to underscores (kubelet pkg/kubelet/cm/cgroup_manager_linux.go,
//     escapeSystemdCgroupName), and the runtimes' container names:
//     cri-containerd-<ID>.scope, crio-<ID>.scope (crio-conmon-<ID>.scope
//     for CRI-O's monitor), docker-<ID>.scope; the cgroupfs driver names
//     the container by its bare ID (crio-<ID> for CRI-O).
//
// The pod segment is found wherever it is: under a kubelet --cgroup-root
// (kind's kubelet.slice/kubelet-kubepods.slice/...), after the "/.."
// entries a reader outside the target's cgroup namespace sees
// (cgroup_namespaces(7)), and in the "<slice>:<prefix>:<name>" notation
// containerd's systemd driver shows on cgroup v1 hierarchies systemd does
// not manage. The unified (v2) line is read first, then the v1 lines in
// order; the first that names a pod wins. A process whose lines name no
// pod is outside every pod: PodUID is empty and that is not an error.
// Content without a single well-formed line is an error.
func ParseCgroup(content string) (CgroupInfo, error) {
	var unified string
	var v1 []string
	for _, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = parts[2]
			continue
		}
		v1 = append(v1, parts[2])
	}
	if unified == "" && len(v1) == 0 {
		if strings.TrimSpace(content) == "" {
			return CgroupInfo{}, errors.New("empty cgroup file")
		}
		return CgroupInfo{}, fmt.Errorf("no cgroup line of the form hierarchy-ID:controllers:/path in %q", firstLine(content))
	}
	paths := v1
	if unified != "" {
		paths = append([]string{unified}, v1...)
	}
	for _, p := range paths {
		if info, ok := parseCgroupPath(p); ok {
			return info, nil
		}
	}
	return CgroupInfo{Path: paths[0]}, nil
}

// parseCgroupPath finds the pod segment of one cgroup path and the
// container segment after it.
func parseCgroupPath(path string) (CgroupInfo, bool) {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		// containerd's systemd driver on a v1 hierarchy systemd does not
		// manage: "kubepods-besteffort-pod<UID>.slice:cri-containerd:<ID>".
		slice, rest, colon := strings.Cut(seg, ":")
		uid, qos, ok := podSegment(slice)
		if !ok {
			continue
		}
		if qos == "" {
			qos = QoSGuaranteed
			if i > 0 {
				switch segs[i-1] {
				case QoSBurstable, QoSBestEffort:
					qos = segs[i-1]
				}
			}
		}
		info := CgroupInfo{PodUID: uid, QoS: qos, Path: path}
		switch {
		case colon:
			info.ContainerID, info.Runtime = systemdUnitContainer(rest)
		case i+1 < len(segs):
			info.ContainerID, info.Runtime = containerSegment(segs[i+1])
		}
		return info, true
	}
	return CgroupInfo{}, false
}

// podSegment recognises a pod cgroup's name: "pod<UID>" (cgroupfs) or
// "<prefix>-pod<UID>.slice" (systemd, UID escaped), where prefix ends in
// kubepods[-burstable|-besteffort]. It returns the UID with dashes and the
// QoS class the name itself shows ("" when it shows none).
func podSegment(seg string) (uid, qos string, ok bool) {
	if raw, found := strings.CutPrefix(seg, "pod"); found {
		if u, valid := podUID(raw, '-'); valid {
			return u, "", true
		}
		return "", "", false
	}
	name, found := strings.CutSuffix(seg, ".slice")
	if !found {
		return "", "", false
	}
	prefix, raw, found := strings.Cut(name, "-pod")
	if !found || !(prefix == "kubepods" || strings.HasSuffix(prefix, "-kubepods") ||
		strings.HasSuffix(prefix, "kubepods-"+QoSBurstable) || strings.HasSuffix(prefix, "kubepods-"+QoSBestEffort)) {
		return "", "", false
	}
	u, valid := podUID(raw, '_')
	if !valid {
		return "", "", false
	}
	switch {
	case strings.HasSuffix(prefix, "-"+QoSBurstable):
		qos = QoSBurstable
	case strings.HasSuffix(prefix, "-"+QoSBestEffort):
		qos = QoSBestEffort
	default:
		qos = QoSGuaranteed
	}
	return u, qos, true
}

// podUID validates a pod UID as it appears in a cgroup name, with sep
// between its groups ('-' for cgroupfs, '_' for systemd), and returns it
// with dashes. Pods from the API server have RFC 4122 UIDs (8-4-4-4-12
// hex digits); static pods have the 32 hex digits of their config's hash
// (kubelet pkg/kubelet/config/common.go, generatePodName/applyDefaults),
// with no separators at all.
func podUID(raw string, sep byte) (string, bool) {
	switch len(raw) {
	case 32:
		if isHex(raw) {
			return raw, true
		}
	case 36:
		b := []byte(raw)
		for i, c := range b {
			switch i {
			case 8, 13, 18, 23:
				if c != sep {
					return "", false
				}
				b[i] = '-'
			default:
				if !isHexDigit(c) {
					return "", false
				}
			}
		}
		return string(b), true
	}
	return "", false
}

// containerSegment reads the container cgroup under a pod's: a systemd
// scope "<runtime prefix>-<ID>.scope", CRI-O's cgroupfs "crio-<ID>", or a
// bare ID (cgroupfs with containerd, dockershim, cri-dockerd).
func containerSegment(seg string) (id, runtime string) {
	name, scope := strings.CutSuffix(seg, ".scope")
	if isContainerID(name) {
		return name, ""
	}
	i := strings.LastIndexByte(name, '-')
	if i < 0 || !isContainerID(name[i+1:]) {
		return "", ""
	}
	prefix := name[:i]
	switch {
	case prefix == "cri-containerd" && scope:
		return name[i+1:], RuntimeContainerd
	case prefix == "crio" || prefix == "crio-conmon":
		return name[i+1:], RuntimeCRIO
	case prefix == "docker" && scope:
		return name[i+1:], RuntimeDocker
	}
	return "", ""
}

// systemdUnitContainer reads the "<prefix>:<name>" after a slice in
// containerd's and CRI-O's systemd cgroupsPath notation.
func systemdUnitContainer(rest string) (id, runtime string) {
	prefix, name, ok := strings.Cut(rest, ":")
	if !ok || !isContainerID(name) {
		return "", ""
	}
	switch prefix {
	case "cri-containerd":
		return name, RuntimeContainerd
	case "crio":
		return name, RuntimeCRIO
	case "docker":
		return name, RuntimeDocker
	}
	return "", ""
}

// isContainerID reports whether s is a CRI container ID: 64 lower-case
// hex digits (containerd, CRI-O and Docker all use a SHA-256 hex string).
func isContainerID(s string) bool { return len(s) == 64 && isHex(s) }

func isHex(s string) bool {
	for i := range len(s) {
		if !isHexDigit(s[i]) {
			return false
		}
	}
	return true
}

func isHexDigit(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' }

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	if len(line) > 80 {
		line = line[:80] + "..."
	}
	return line
}

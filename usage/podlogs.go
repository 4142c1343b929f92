package usage

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// PodLogsDir is the kubelet's pod log directory under the host root (its
// podLogsDir, /var/log/pods by default).
func PodLogsDir(hostRoot string) string { return filepath.Join(hostRoot, "var/log/pods") }

// readPodLogDirs lists the kubelet's pod log directories, which name each
// pod it runs "<namespace>_<name>_<uid>" (kubelet pkg/kubelet/kuberuntime/
// helpers.go, BuildPodLogsDirectory; neither namespaces, names nor UIDs
// can hold an underscore). It is the one local place that ties a running
// pod's name, which the pod-resources API gives, to its UID, which a
// process's cgroup gives, for pods without devices too. The kubelet
// creates the directory with the pod's sandbox and removes it once the
// pod is deleted (container garbage collection), so it may outlive a pod
// for a while: only the UIDs of pods the kubelet still lists are taken
// from it.
func readPodLogDirs(dir string) (map[podName][]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("pod log directories: %w", err)
	}
	out := map[podName][]string{}
	for _, e := range entries {
		parts := strings.Split(e.Name(), "_")
		if !e.IsDir() || len(parts) != 3 || parts[0] == "" || parts[1] == "" {
			continue
		}
		uid, ok := podUID(parts[2], '-')
		if !ok {
			continue
		}
		p := podName{namespace: parts[0], name: parts[1]}
		out[p] = append(out[p], uid)
	}
	return out, nil
}

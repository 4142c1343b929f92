package usage

// RunningPodUIDs are the UIDs of the pods whose log directories the
// kubelet keeps under hostRoot (readPodLogDirs): every pod it runs, and
// for a while pods it has just deleted. Callers that must not act on a
// running pod's behalf treat a UID here as running.
func RunningPodUIDs(hostRoot string) (map[string]bool, error) {
	dirs, err := readPodLogDirs(PodLogsDir(hostRoot))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, uids := range dirs {
		for _, u := range uids {
			out[u] = true
		}
	}
	return out, nil
}

package usage

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// CheckpointFile is the kubelet device manager's checkpoint in its
// device-plugin directory (kubelet pkg/kubelet/cm/devicemanager/types.go,
// kubeletDeviceManagerCheckpoint).
const CheckpointFile = "kubelet_internal_checkpoint"

// CheckpointPath is the checkpoint under the device-plugin directory the
// agent registers in (the kubelet keeps it beside kubelet.sock).
func CheckpointPath(devicePluginDir string) string {
	return filepath.Join(devicePluginDir, CheckpointFile)
}

// CheckpointEntry is one container's devices of one resource, as the
// kubelet's device manager recorded them when it allocated them.
type CheckpointEntry struct {
	PodUID    string
	Container string
	Resource  string
	// DeviceIDs are the IDs the device plugin advertised (GPU and MIG
	// UUIDs, replicas "<uuid>::<n>"), over every NUMA node, sorted.
	DeviceIDs []string
}

// checkpointData is the JSON the kubelet writes (pkg/kubelet/cm/
// devicemanager/checkpoint/checkpoint.go: Data{Data: checkpointData{
// PodDeviceEntries []PodDevicesEntry, RegisteredDevices}, Checksum}).
// DeviceIDs is checkpoint.DevicesPerNUMA, map[int64][]string, an object
// keyed by NUMA node ("-1": none) since kubelet 1.20; before that a plain
// list, which is read too.
type checkpointData struct {
	Data *struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     json.RawMessage
		}
	}
}

// ReadCheckpoint reads and parses the checkpoint at path. An error wraps
// fs.ErrNotExist when there is none; any other error means the file is
// unreadable or not a checkpoint (e.g. cut short), and nothing may be
// concluded from it. The kubelet writes the file atomically (a temporary
// file renamed over it), so a complete read is one consistent version. Its
// checksum is not verified: the kubelet computes it over a spew dump of
// its Go structures (checkpointmanager/checksum), which only the kubelet's
// own types reproduce.
func ReadCheckpoint(path string) ([]CheckpointEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kubelet device checkpoint: %w", err)
	}
	entries, err := ParseCheckpoint(b)
	if err != nil {
		return nil, fmt.Errorf("kubelet device checkpoint %s: %w", path, err)
	}
	return entries, nil
}

// ParseCheckpoint parses the checkpoint's content (see ReadCheckpoint).
func ParseCheckpoint(b []byte) ([]CheckpointEntry, error) {
	var cp checkpointData
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("not a device-manager checkpoint: %w", err)
	}
	if cp.Data == nil {
		return nil, errors.New("not a device-manager checkpoint: no Data")
	}
	out := make([]CheckpointEntry, 0, len(cp.Data.PodDeviceEntries))
	for i, e := range cp.Data.PodDeviceEntries {
		if e.PodUID == "" || e.ResourceName == "" {
			return nil, fmt.Errorf("entry %d: no PodUID or ResourceName", i)
		}
		ids, err := checkpointDeviceIDs(e.DeviceIDs)
		if err != nil {
			return nil, fmt.Errorf("entry %d (pod %s, container %q): %w", i, e.PodUID, e.ContainerName, err)
		}
		out = append(out, CheckpointEntry{PodUID: e.PodUID, Container: e.ContainerName, Resource: e.ResourceName, DeviceIDs: ids})
	}
	return out, nil
}

// checkpointDeviceIDs flattens DeviceIDs: per NUMA node, or a plain list.
func checkpointDeviceIDs(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var ids []string
	if raw[0] == '[' {
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, fmt.Errorf("DeviceIDs: %w", err)
		}
	} else {
		var perNUMA map[string][]string
		if err := json.Unmarshal(raw, &perNUMA); err != nil {
			return nil, fmt.Errorf("DeviceIDs: %w", err)
		}
		for numa, l := range perNUMA {
			if _, err := strconv.ParseInt(numa, 10, 64); err != nil {
				return nil, fmt.Errorf("DeviceIDs: NUMA node %q is not a number", numa)
			}
			ids = append(ids, l...)
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// checkpointNotWritten says err (from ReadCheckpoint) is the checkpoint
// absent from a device-plugin directory that exists: the kubelet has not
// written one yet. Its device manager writes the checkpoint when a device
// plugin's device list arrives, when a registered resource goes away and
// after an allocation (kubelet v1.37 pkg/kubelet/cm/devicemanager/
// manager.go, the callers of writeCheckpoint), so a kubelet no device
// plugin ever registered with has none, and no device-plugin assignment.
// A missing directory (not mounted) is not this.
func checkpointNotWritten(devicePluginDir string, err error) bool {
	if !errors.Is(err, fs.ErrNotExist) || devicePluginDir == "" {
		return false
	}
	st, serr := os.Stat(devicePluginDir)
	return serr == nil && st.IsDir()
}

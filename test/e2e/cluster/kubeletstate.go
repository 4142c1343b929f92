package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// KubeletMetric returns the samples of one metric from the kubelet's
// /metrics (through the API server's node proxy), keyed by the label part
// of the line ("" without labels).
func (c *Cluster) KubeletMetric(ctx context.Context, name string) (map[string]float64, error) {
	raw, err := c.Client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", c.NodeName, "proxy", "metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kubelet metrics: %w", err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1024*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		var labels string
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			labels, rest = rest[1:end], rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // a longer metric name
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		out[labels] = v
	}
	return out, nil
}

// Allocation is one container's devices of one resource, as the kubelet's
// device manager recorded them in its checkpoint.
type Allocation struct {
	PodUID, Container, Resource string
	DeviceIDs                   []string
}

// DeviceAllocations reads the device manager's checkpoint
// (/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint).
func (c *Cluster) DeviceAllocations() ([]Allocation, error) {
	data, err := os.ReadFile(filepath.Join(DevicePluginDir, "kubelet_internal_checkpoint"))
	if err != nil {
		return nil, fmt.Errorf("read device manager checkpoint: %w", err)
	}
	var cp struct {
		Data struct {
			PodDeviceEntries []struct {
				PodUID        string
				ContainerName string
				ResourceName  string
				DeviceIDs     map[string][]string
			}
		}
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("decode device manager checkpoint: %w", err)
	}
	var out []Allocation
	for _, e := range cp.Data.PodDeviceEntries {
		a := Allocation{PodUID: e.PodUID, Container: e.ContainerName, Resource: e.ResourceName}
		for _, ids := range e.DeviceIDs { // keyed by NUMA node
			a.DeviceIDs = append(a.DeviceIDs, ids...)
		}
		sort.Strings(a.DeviceIDs)
		out = append(out, a)
	}
	return out, nil
}

package cluster

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeResources returns the node's capacity and allocatable counts of the
// resources whose names start with prefix (e.g. "nvidia.com/").
func (c *Cluster) NodeResources(ctx context.Context, prefix string) (capacity, allocatable map[string]int64, err error) {
	node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("get node %s: %w", c.NodeName, err)
	}
	return filterResources(node.Status.Capacity, prefix), filterResources(node.Status.Allocatable, prefix), nil
}

func filterResources(l corev1.ResourceList, prefix string) map[string]int64 {
	out := map[string]int64{}
	for name, q := range l {
		if strings.HasPrefix(string(name), prefix) {
			out[string(name)] = q.Value()
		}
	}
	return out
}

// WaitNodeResources waits until the node's resources under prefix are
// exactly capacity and allocatable (a nil map is not checked), ignoring
// resources at 0 (the kubelet keeps a resource at 0 for a while after its
// plugin goes away) and, in capacity, resources not wanted there with
// nothing allocatable (a gone plugin's, kept for the kubelet's grace
// period). Unhealthy devices count in capacity, not allocatable.
func (c *Cluster) WaitNodeResources(ctx context.Context, prefix string, capacity, allocatable map[string]int64) error {
	var lastCap, lastAlloc map[string]int64
	for {
		gotCap, gotAlloc, err := c.NodeResources(ctx, prefix)
		if err == nil {
			lastCap, lastAlloc = nonZero(gotCap), nonZero(gotAlloc)
			if capacity != nil {
				for name := range lastCap {
					// A resource whose plugin is gone (e.g. a renamed
					// time-sliced resource after the agent's config
					// dropped it) keeps its capacity with nothing
					// allocatable for the kubelet's endpointStopGracePeriod
					// (5 minutes, pkg/kubelet/cm/devicemanager/types.go):
					// that is the kubelet's, not the agent's, and a caller
					// not expecting the resource ignores it.
					if _, want := capacity[name]; !want && lastAlloc[name] == 0 {
						delete(lastCap, name)
					}
				}
			}
			if (capacity == nil || maps.Equal(lastCap, capacity)) && (allocatable == nil || maps.Equal(lastAlloc, allocatable)) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node resources %s*: capacity %s, allocatable %s, want capacity %s, allocatable %s: %w",
				prefix, FormatResources(lastCap), FormatResources(lastAlloc), FormatResources(capacity), FormatResources(allocatable), ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// FormatResources prints a resource map sorted, for messages.
func FormatResources(m map[string]int64) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, " ") + "}"
}

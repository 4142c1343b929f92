package agent

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

type allHealthy struct{}

func (allHealthy) Healthy(string) bool { return true }

// TestInventoryPlacesReplicas: the printed inventory says which GPU each
// time-sliced replica is on, as for the device itself.
func TestInventoryPlacesReplicas(t *testing.T) {
	node, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	ts := &gpu.TimeSlicing{Resources: []gpu.SharedResource{{Name: gpu.ResourceGPU, Replicas: 2}}}
	rs, err := gpu.Resources(node, gpu.Config{TimeSlicing: ts, HostRoot: t.TempDir()}, allHealthy{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := (&inventory{}).render(state{node: node, resources: rs})
	for _, g := range node.GPUs {
		for r := range 2 {
			line := regexp.MustCompile(fmt.Sprintf(`(?m)^nvidia\.com/gpu +%s +GPU %d +healthy`, regexp.QuoteMeta(gpu.ReplicaID(g.UUID, r)), g.Index))
			if !line.MatchString(out) {
				t.Errorf("no line for replica %d of GPU %d on it in\n%s", r, g.Index, out)
			}
		}
	}
	if !strings.Contains(out, "nvidia.com/gpu  16       16") {
		t.Errorf("summary does not count 16 healthy replicas:\n%s", out)
	}
}

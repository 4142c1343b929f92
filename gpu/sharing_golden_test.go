package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// TestNVIDIAExamplesGolden serves NVIDIA's own time-slicing examples
// (testdata/nvidia, each file's header names its source) read with
// --nvidia-config on simulated nodes and compares what is served with
// testdata/nvidia/<example>.golden: every resource with its device IDs, the
// gpu-feature-discovery labels of each shared resource, and what Allocate
// does with two replicas of one GPU. The tables were checked against
// NVIDIA's code, k8s-device-plugin v0.17-v0.20:
//   - resource names: internal/rm/device_map.go (nvidia.com/gpu,
//     nvidia.com/mig-<profile> under mixed) and updateDeviceMapWithReplicas
//     (renamed to <name>.shared by renameByDefault, api/config/v1
//     replicas.go);
//   - device IDs: NewAnnotatedID, "<uuid>::<n>" for n from 0 to replicas-1
//     (internal/rm/devices.go), for each device of the resource;
//   - labels: internal/lm/resource.go (count = devices, replicas as
//     configured, sharing-strategy time-slicing, product "-SHARED" unless
//     renamed);
//   - Allocate: internal/rm/rm.go ValidateRequest (more than one replica
//     refused with failRequestsGreaterThanOne), internal/plugin/server.go
//     uniqueDeviceIDsFromAnnotatedDeviceIDs (the GPU once).
//
// UPDATE_GOLDEN=1 rewrites the files; review the diff against the rules
// above before committing one.
func TestNVIDIAExamplesGolden(t *testing.T) {
	dgxH100 := func() (*topology.Node, error) { return sim.Profile("dgx-h100") }
	tests := []struct {
		example string
		node    string // for the golden header
		build   func() (*topology.Node, error)
	}{
		{"readme-time-slicing", "dgx-h100", dgxH100},
		{"readme-rename", "dgx-h100", dgxH100},
		{"readme-fail-requests", "dgx-h100", dgxH100},
		{"operator-time-slicing-config-all", "dgx-h100", dgxH100},
		// The simulator has no T4; any GPU shows the same rules.
		{"operator-time-slicing-config-fine-tesla-t4", "pcie-8gpu", func() (*topology.Node, error) { return sim.Profile("pcie-8gpu") }},
		{"operator-time-slicing-config-fine-a100-40gb", "dgx-a100,mig=0:7x1g.5gb,mig=1:3g.20gb+2g.10gb+1g.5gb+1g.5gb,mig=2:7g.40gb", func() (*topology.Node, error) {
			return sim.Profile("dgx-a100",
				sim.WithMIG(0, repeat("1g.5gb", 7)...),
				sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"),
				sim.WithMIG(2, "7g.40gb"))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.example, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "nvidia", tc.example+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			nv, err := ParseNVIDIAConfig(data)
			if err != nil {
				t.Fatal(err)
			}
			if len(nv.Ignored) > 0 {
				t.Errorf("NVIDIA's example sets what the agent ignores: %q", nv.Ignored)
			}
			node, err := tc.build()
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{TimeSlicing: nv.TimeSlicing, HostRoot: t.TempDir()}
			if nv.MIGStrategy != nil {
				cfg.MIGStrategy = *nv.MIGStrategy
			}
			rs, err := Resources(node, cfg, healthMap{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			checkReplicaRules(t, node, cfg, rs)
			got := goldenTable(t, tc.example, tc.node, node, cfg, rs)
			path := filepath.Join("testdata", "nvidia", tc.example+".golden")
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (UPDATE_GOLDEN=1 writes it)", err)
			}
			if got != string(want) {
				t.Errorf("served differs from %s:\n%s", path, lineDiff(string(want), got))
			}
		})
	}
}

// checkReplicaRules checks the rules the golden tables follow, independently
// of them: every device of a shared resource has exactly replicas IDs
// <uuid>::0..replicas-1, under the served name, and nothing else is there.
func checkReplicaRules(t *testing.T, node *topology.Node, cfg Config, rs []plugin.Resource) {
	t.Helper()
	served := map[string][]string{}
	for _, r := range rs {
		served[r.Name()] = idsOf(r)
	}
	for _, sr := range cfg.TimeSlicing.Resources {
		var want []string
		for _, g := range node.GPUs {
			switch {
			case sr.Name == ResourceGPU && !(g.MIGEnabled && cfg.MIGStrategy == MIGStrategyMixed):
				want = append(want, replicasOf(g.UUID, sr.Replicas)...)
			case IsMIGResource(sr.Name) && g.MIGEnabled:
				for _, m := range g.MIG {
					if topology.MIGResourceName(m.Profile) == sr.Name {
						want = append(want, replicasOf(m.UUID, sr.Replicas)...)
					}
				}
			}
		}
		name := sr.ServedName(cfg.TimeSlicing.RenameByDefault)
		if !slices.Equal(served[name], want) {
			t.Errorf("%s served as %s: %d devices %v, want %d %v", sr.Name, name, len(served[name]), served[name], len(want), want)
		}
	}
}

// goldenTable renders what is served: resources and their IDs, the
// sharing labels, and an Allocate of two replicas of one GPU.
func goldenTable(t *testing.T, example, nodeSpec string, node *topology.Node, cfg Config, rs []plugin.Resource) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# testdata/nvidia/%s.yaml served on a simulated %s, mig-strategy %s.\n", example, nodeSpec, cmpOrString(cfg.MIGStrategy, MIGStrategyNone))
	fmt.Fprintf(&b, "# Resources: name, device count, then the device IDs, one device's replicas a line.\n")
	for _, r := range rs {
		ids := idsOf(r)
		fmt.Fprintf(&b, "%s %d\n", r.Name(), len(ids))
		var line []string
		for i, id := range ids {
			line = append(line, id)
			if i == len(ids)-1 || SharedUUID(ids[i+1]) != SharedUUID(id) {
				fmt.Fprintf(&b, "  %s\n", strings.Join(line, " "))
				line = nil
			}
		}
	}
	fmt.Fprintf(&b, "# gpu-feature-discovery's labels of the resources (count, product, replicas, sharing-strategy).\n")
	labels := topology.Labels(node, cfg.MIGStrategy, cfg.TimeSlicing.LabelSharing())
	var keys []string
	for k := range labels {
		for _, suffix := range []string{".count", ".product", ".replicas", ".sharing-strategy"} {
			if strings.HasPrefix(k, "nvidia.com/") && strings.HasSuffix(k, suffix) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, labels[k])
	}
	fmt.Fprintf(&b, "# Allocate of two replicas of one device, for each shared resource.\n")
	for _, r := range rs {
		ids := idsOf(r)
		if len(ids) < 2 || SharedUUID(ids[0]) != SharedUUID(ids[1]) {
			continue
		}
		resp, err := r.Allocate(context.Background(), ids[:2])
		if err != nil {
			fmt.Fprintf(&b, "%s %s: refused: %v\n", r.Name(), strings.Join(ids[:2], ","), err)
			continue
		}
		fmt.Fprintf(&b, "%s %s: NVIDIA_VISIBLE_DEVICES=%s\n", r.Name(), strings.Join(ids[:2], ","), resp.Envs[visibleDevicesEnv])
	}
	return b.String()
}

func cmpOrString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// lineDiff shows the lines of want and got that differ, with line numbers.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, a, b))
		}
		if len(out) > 20 {
			out = append(out, "...")
			break
		}
	}
	return strings.Join(out, "\n")
}

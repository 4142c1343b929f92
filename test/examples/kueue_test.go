// Package examples tests the manifests under deploy/examples against the
// APIs they are written for and against the labels the agent writes.
package examples

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const kueueExample = "../../deploy/examples/kueue-topology.yaml"

// Kueue's Topology and ResourceFlavor, kueue.x-k8s.io/v1beta2, mirrored
// field for field from sigs.k8s.io/kueue v0.19.2
// (apis/kueue/v1beta2/topology_types.go, resourceflavor_types.go) rather
// than imported: the module's requirements would move dependencies this
// module shares with the Kubernetes binaries it builds. Decoding with
// unknown fields refused makes a misspelt or invented field fail.
type kueueTopology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Levels []struct {
			NodeLabel string `json:"nodeLabel,omitempty"`
		} `json:"levels,omitempty"`
	} `json:"spec"`
}

type kueueResourceFlavor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		NodeLabels   map[string]string   `json:"nodeLabels,omitempty"`
		NodeTaints   []corev1.Taint      `json:"nodeTaints,omitempty"`
		Tolerations  []corev1.Toleration `json:"tolerations,omitempty"`
		TopologyName *string             `json:"topologyName,omitempty"`
	} `json:"spec,omitempty"`
}

const kueueAPIVersion = "kueue.x-k8s.io/v1beta2"

// Kueue's validation of the fields (kubebuilder markers of v0.19.2):
// TopologyLevel.NodeLabel's pattern, at most 316 characters; 1 to 16
// levels; at most 8 nodeLabels; TopologyReference's pattern.
var (
	kueueNodeLabel    = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$`)
	kueueTopologyName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// Keys of others: topograph's (NVIDIA/topograph docs/engines/k8s.md:
// fabric.topograph.run/tier-N, accelerator.topograph.run/domain and
// sub-domain), Kueue's, and the kubelet's hostname.
var foreignPrefixes = []string{"fabric.topograph.run/", "accelerator.topograph.run/", "kueue.x-k8s.io/"}

const hostnameLabel = "kubernetes.io/hostname"

// decodeStrict decodes one YAML document into out, refusing duplicate and
// unknown fields.
func decodeStrict(doc []byte, out any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	return dec.Decode(out)
}

// readKueueExample decodes the example's Topology and ResourceFlavor.
func readKueueExample(t *testing.T) (kueueTopology, kueueResourceFlavor) {
	t.Helper()
	f, err := os.Open(kueueExample)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var topos []kueueTopology
	var flavors []kueueResourceFlavor
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatal(err)
		}
		if tm.APIVersion == "" && tm.Kind == "" {
			continue // comments only
		}
		if tm.APIVersion != kueueAPIVersion {
			t.Errorf("%s %s: apiVersion %q, want %q", tm.Kind, kueueExample, tm.APIVersion, kueueAPIVersion)
		}
		switch tm.Kind {
		case "Topology":
			var topo kueueTopology
			if err := decodeStrict(doc, &topo); err != nil {
				t.Fatalf("Topology: %v", err)
			}
			topos = append(topos, topo)
		case "ResourceFlavor":
			var rf kueueResourceFlavor
			if err := decodeStrict(doc, &rf); err != nil {
				t.Fatalf("ResourceFlavor: %v", err)
			}
			flavors = append(flavors, rf)
		default:
			t.Fatalf("%s: unexpected kind %q", kueueExample, tm.Kind)
		}
	}
	if len(topos) != 1 || len(flavors) != 1 {
		t.Fatalf("%s: %d Topologies and %d ResourceFlavors, want one of each", kueueExample, len(topos), len(flavors))
	}
	return topos[0], flavors[0]
}

// agentLabels are the labels the agent writes on a simulated node of
// profile (discovered through its NVML, as the agent does) under each MIG
// strategy.
func agentLabels(t *testing.T, profile string) map[string]map[string]string {
	t.Helper()
	spec, err := sim.Profile(profile)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	node, err := nvmlowner.Discover(n.NVML(), n.HostRoot(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if why := topology.LabelsComplete(node); why != "" {
		t.Fatalf("%s: discovery incomplete: %s", profile, why)
	}
	out := map[string]map[string]string{}
	for _, s := range []string{topology.MIGStrategyNone, topology.MIGStrategySingle, topology.MIGStrategyMixed} {
		out[s] = topology.Labels(node, s, nil)
	}
	return out
}

// TestKueueTopologyExample checks deploy/examples/kueue-topology.yaml:
// Kueue would accept it, its levels are topograph's tiers, then the
// agent's gpu.clique, then the hostname, the agent writes none of
// topograph's or Kueue's keys, and a simulated GB200 NVL72 tray carries
// every label the flavor and the agent's level need.
func TestKueueTopologyExample(t *testing.T) {
	topo, rf := readKueueExample(t)

	var levels []string
	for _, l := range topo.Spec.Levels {
		levels = append(levels, l.NodeLabel)
	}
	if len(levels) < 1 || len(levels) > 16 {
		t.Fatalf("%d levels, Kueue allows 1 to 16", len(levels))
	}
	for i, l := range levels {
		if !kueueNodeLabel.MatchString(l) || len(l) > 316 {
			t.Errorf("level %d: %q does not match Kueue's nodeLabel pattern", i, l)
		}
		if errs := validation.IsQualifiedName(l); len(errs) > 0 {
			t.Errorf("level %d: %q is not a label key: %v", i, l, errs)
		}
		if slices.Index(levels, l) != i {
			t.Errorf("level %d: %q repeats (Kueue: must be unique)", i, l)
		}
	}
	n := len(levels)
	if levels[n-1] != hostnameLabel {
		t.Errorf("lowest level %q, want %s", levels[n-1], hostnameLabel)
	}
	if n < 2 || levels[n-2] != topology.LabelGPUClique {
		t.Fatalf("levels %v: want %s just above the hostname", levels, topology.LabelGPUClique)
	}
	tiers := levels[:n-2]
	if len(tiers) == 0 {
		t.Error("no network tier above the NVLink domain")
	}
	prev := -1
	for _, l := range tiers {
		tier, ok := strings.CutPrefix(l, "fabric.topograph.run/tier-")
		if !ok {
			t.Errorf("level %q is not one of topograph's fabric tiers", l)
			continue
		}
		k, err := strconv.Atoi(tier)
		if err != nil || k < 0 {
			t.Errorf("level %q: tier %q is not a number", l, tier)
			continue
		}
		// Top to bottom: tier numbers fall towards the node.
		if prev >= 0 && k >= prev {
			t.Errorf("level %q below tier %d: tiers must run from the farthest to the nearest", l, prev)
		}
		prev = k
	}

	if rf.Spec.TopologyName == nil || *rf.Spec.TopologyName != topo.Name {
		t.Errorf("ResourceFlavor topologyName %v, want the Topology %q", rf.Spec.TopologyName, topo.Name)
	} else if !kueueTopologyName.MatchString(*rf.Spec.TopologyName) || len(*rf.Spec.TopologyName) > 253 {
		t.Errorf("topologyName %q does not match Kueue's pattern", *rf.Spec.TopologyName)
	}
	if k := len(rf.Spec.NodeLabels); k < 1 || k > 8 {
		t.Errorf("%d nodeLabels; Kueue wants 1 to 8 with a topology", k)
	}
	for k, v := range rf.Spec.NodeLabels {
		if errs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(errs) > 0 {
			t.Errorf("nodeLabels %s=%s: %v", k, v, errs)
		}
	}

	// No label the agent writes, on any simulated node, is one of
	// topograph's, Kueue's or the kubelet's; of the levels it writes the
	// clique only.
	for _, profile := range sim.Profiles() {
		for strategy, labels := range agentLabels(t, profile) {
			for k := range labels {
				if k == hostnameLabel || slices.ContainsFunc(foreignPrefixes, func(p string) bool { return strings.HasPrefix(k, p) }) {
					t.Errorf("%s (%s): the agent writes %s, a key it does not own", profile, strategy, k)
				}
				if slices.Contains(levels, k) && k != topology.LabelGPUClique {
					t.Errorf("%s (%s): the agent writes level %s", profile, strategy, k)
				}
			}
		}
	}

	// The multi-node NVLink tray carries a valid clique and every label
	// the flavor selects by; a DGX H100 (one NVLink domain of its own,
	// no cluster UUID) has no clique, so Kueue leaves it out.
	gb200 := agentLabels(t, "gb200-nvl72")[topology.MIGStrategyNone]
	clique, ok := gb200[topology.LabelGPUClique]
	if !ok {
		t.Fatalf("gb200-nvl72: no %s label", topology.LabelGPUClique)
	}
	if errs := validation.IsValidLabelValue(clique); len(errs) > 0 {
		t.Errorf("gb200-nvl72: %s=%q is not a valid label value: %v", topology.LabelGPUClique, clique, errs)
	}
	for k, v := range rf.Spec.NodeLabels {
		if gb200[k] != v {
			t.Errorf("gb200-nvl72: %s=%q, the flavor selects %q", k, gb200[k], v)
		}
	}
	if v, ok := agentLabels(t, "dgx-h100")[topology.MIGStrategyNone][topology.LabelGPUClique]; ok {
		t.Errorf("dgx-h100: %s=%q, want none (no multi-node NVLink domain)", topology.LabelGPUClique, v)
	}
}

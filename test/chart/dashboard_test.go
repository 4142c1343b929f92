package chart

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// DashboardFile is the Grafana dashboard, relative to the root.
const DashboardFile = "deploy/grafana/gpu-node-agent.json"

// recordedName matches the agent's recording rules' series names.
var recordedName = regexp.MustCompile(`\bgpu_node_agent:[a-z0-9_:]+`)

var metricName = regexp.MustCompile(`\b(DCGM_FI_[A-Z0-9_]+|gpu_node_agent_[a-z0-9_]+|process_[a-z0-9_]+)\b`)

// servedMetrics collects the metric names the agent's source declares
// (Name: "gpu_node_agent_..." options and the DCGM field table), so the
// dashboard cannot drift from what is served.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	served := map[string]bool{"process_resident_memory_bytes": true}
	decl := regexp.MustCompile(`"(DCGM_FI_[A-Z0-9_]+|gpu_node_agent_[a-z0-9_]+)"`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "test" || d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			served[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return served
}

type dashboard struct {
	Panels []panel
}

type panel struct {
	ID      int `json:"id"`
	Title   string
	Type    string
	Targets []struct {
		RefID  string `json:"refId"`
		Expr   string
		Format string
	}
	// Panels are those of a collapsed row.
	Panels []panel
}

// allPanels lists d's panels, those inside collapsed rows too.
func (d dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashboardVars stands in for the dashboard's template variables in
// queries checked outside Grafana ($block: 8-GPU pods).
func dashboardVars() *strings.Replacer {
	return strings.NewReplacer("$node", ".*", "$gpu", ".*", "$instance", ".*", "$block", "8")
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", DashboardFile, err)
	}
	return d
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	served := servedMetrics(t)
	var exprs []string
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if !served[base] {
					t.Errorf("panel %q uses %s, which the agent does not serve", p.Title, m)
				}
			}
		}
	}
	if len(exprs) < 20 {
		t.Fatalf("dashboard has %d queries; expected the full set", len(exprs))
	}
	// A recorded series a panel charts is one the rules file records.
	groups, _ := loadRules(t)
	recorded := map[string]bool{}
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			for _, m := range recordedName.FindAllString(tg.Expr, -1) {
				if !recorded[m] {
					t.Errorf("panel %q charts %s, which %s does not record", p.Title, m, RulesFile)
				}
			}
		}
	}

	// promtool parses every query (as recording rules, variables expanded).
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("promtool not installed (make deps-prometheus): %v", err)
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(dashboardVars().Replace(e)) // a JSON string is a valid YAML scalar
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
	}
	file := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(file, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("dashboard queries do not parse: %v\n%s", err, out)
	}
}

// fleetSeries is a fleet of seven nodes as their agents report it, with
// values derived in topology/free_test.go: a DGX H100 idle (8 free, one
// NVSwitch block of 8), a DGX-1V with GPUs 0 and 5 allocated (6 free,
// largest NVLink block 3), a DGX-1V with 0 1 4 5 allocated (4 free, block
// 2), a DGX-2 idle (16 free, block 16), a node with every GPU allocated,
// and two nodes with MIG devices free. Their move advice: none on the
// idle nodes (wholly free: 8 and 16); on the DGX-1Vs one pod each (GPU 5's
// pod frees the quad 4-7; the pod on 0 and 1 frees 0-3): a block of 4, not
// the node; on the full node (a DGX H100 with one 8-GPU pod) that pod,
// which frees the whole node. GPU utilization: five whole GPUs
// at 0, 5, 35, 100, 100 on node-a, one at 10 on node-b, and a MIG device
// (GPU_I_ID 1) at 0 that the fleet heat map leaves out.
var fleetSeries = []struct{ series, values string }{
	{`gpu_node_agent_free_gpus{Hostname="node-a"}`, "8x10"},
	{`gpu_node_agent_free_gpus{Hostname="node-b"}`, "6x10"},
	{`gpu_node_agent_free_gpus{Hostname="node-c"}`, "4x10"},
	{`gpu_node_agent_free_gpus{Hostname="node-d"}`, "16x10"},
	{`gpu_node_agent_free_gpus{Hostname="node-e"}`, "0x10"},
	{`gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-a"}`, "8x10"},
	{`gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-b"}`, "3x10"},
	{`gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-c"}`, "2x10"},
	{`gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-d"}`, "16x10"},
	{`gpu_node_agent_largest_free_nvlink_block_gpus{Hostname="node-e"}`, "0x10"},
	{`gpu_node_agent_free_mig_devices{Hostname="node-f",profile="1g.10gb"}`, "8x10"},
	{`gpu_node_agent_free_mig_devices{Hostname="node-f",profile="2g.20gb"}`, "1x10"},
	{`gpu_node_agent_free_mig_devices{Hostname="node-f",profile="3g.40gb"}`, "0x10"},
	{`gpu_node_agent_free_mig_devices{Hostname="node-g",profile="1g.10gb"}`, "3x10"},
	{`gpu_node_agent_move_advice_pods{Hostname="node-a"}`, "0x10"},
	{`gpu_node_agent_move_advice_pods{Hostname="node-b"}`, "1x10"},
	{`gpu_node_agent_move_advice_pods{Hostname="node-c"}`, "1x10"},
	{`gpu_node_agent_move_advice_pods{Hostname="node-d"}`, "0x10"},
	{`gpu_node_agent_move_advice_pods{Hostname="node-e"}`, "1x10"},
	{`gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-a"}`, "8x10"},
	{`gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-b"}`, "4x10"},
	{`gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-c"}`, "4x10"},
	{`gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-d"}`, "16x10"},
	{`gpu_node_agent_largest_free_nvlink_block_if_moved_gpus{Hostname="node-e"}`, "8x10"},
	{`gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-a"}`, "8x10"},
	{`gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-b"}`, "0x10"},
	{`gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-c"}`, "0x10"},
	{`gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-d"}`, "16x10"},
	{`gpu_node_agent_whole_node_free_if_moved_gpus{Hostname="node-e"}`, "8x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-a",gpu="0"}`, "0x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-a",gpu="1"}`, "5x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-a",gpu="2"}`, "35x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-a",gpu="3"}`, "100x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-a",gpu="4"}`, "100x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-b",gpu="0"}`, "10x10"},
	{`DCGM_FI_DEV_GPU_UTIL{Hostname="node-b",gpu="1",GPU_I_ID="1"}`, "0x10"},
}

// TestDashboardFleetQueries evaluates the fleet row's queries with
// promtool on fleetSeries ($block = 8) against hand-derived answers, and
// the room panel on a fleet whose agents report no fragmentation yet.
func TestDashboardFleetQueries(t *testing.T) {
	type want struct {
		title, ref string
		samples    map[string]float64 // labels → value
	}
	fleet := []want{
		{"Free GPUs by node", "A", map[string]float64{
			`{Hostname="node-a"}`: 8, `{Hostname="node-b"}`: 6, `{Hostname="node-c"}`: 4,
			`{Hostname="node-d"}`: 16, `{Hostname="node-e"}`: 0,
		}},
		{"Largest free NVLink block by node", "A", map[string]float64{
			`{Hostname="node-a"}`: 8, `{Hostname="node-b"}`: 3, `{Hostname="node-c"}`: 2,
			`{Hostname="node-d"}`: 16, `{Hostname="node-e"}`: 0,
		}},
		// Free: 8+6+4+16+0 = 34. In whole 8-GPU blocks: floor(8/8)*8 +
		// floor(3/8)*8 + floor(2/8)*8 + floor(16/8)*8 + 0 = 8+0+0+16 = 24.
		// Stranded: 34-24 = 10. Nodes with a block of 8: node-a, node-d.
		{"Room for $block-GPU pods", "A", map[string]float64{`{}`: 34}},
		{"Room for $block-GPU pods", "B", map[string]float64{`{}`: 24}},
		{"Room for $block-GPU pods", "C", map[string]float64{`{}`: 10}},
		{"Room for $block-GPU pods", "D", map[string]float64{`{}`: 2}},
		// The nodes whose advice names pods: node-b, node-c and node-e.
		{"Nodes with move advice", "A", map[string]float64{
			`{Hostname="node-b"}`: 1, `{Hostname="node-c"}`: 1, `{Hostname="node-e"}`: 1,
		}},
		{"Nodes with move advice", "B", map[string]float64{
			`{Hostname="node-b"}`: 3, `{Hostname="node-c"}`: 2, `{Hostname="node-e"}`: 0,
		}},
		{"Nodes with move advice", "C", map[string]float64{
			`{Hostname="node-b"}`: 4, `{Hostname="node-c"}`: 4, `{Hostname="node-e"}`: 8,
		}},
		{"Nodes with move advice", "D", map[string]float64{
			`{Hostname="node-b"}`: 0, `{Hostname="node-c"}`: 0, `{Hostname="node-e"}`: 8,
		}},
		{"Free MIG devices by profile", "A", map[string]float64{
			`{profile="1g.10gb"}`: 11, `{profile="2g.20gb"}`: 1, `{profile="3g.40gb"}`: 0,
		}},
		// Whole GPUs at 0, 5, 10, 35, 100, 100: cumulative counts per
		// upper bound, as a Prometheus histogram's buckets.
		{"GPU utilization across the fleet", "A", map[string]float64{
			`{le="0"}`: 1, `{le="10"}`: 3, `{le="20"}`: 3, `{le="30"}`: 3, `{le="40"}`: 4, `{le="50"}`: 4,
			`{le="60"}`: 4, `{le="70"}`: 4, `{le="80"}`: 4, `{le="90"}`: 4, `{le="100"}`: 6,
		}},
	}
	empty := []want{
		{"Room for $block-GPU pods", "A", map[string]float64{`{}`: 0}},
		{"Room for $block-GPU pods", "B", map[string]float64{`{}`: 0}},
		{"Room for $block-GPU pods", "C", map[string]float64{`{}`: 0}},
		{"Room for $block-GPU pods", "D", map[string]float64{`{}`: 0}},
	}

	d := loadDashboard(t)
	byTitle := map[string]panel{}
	for _, p := range d.allPanels() {
		byTitle[p.Title] = p
	}
	expr := func(w want) string {
		t.Helper()
		p, ok := byTitle[w.title]
		if !ok {
			t.Fatalf("dashboard has no panel %q", w.title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == w.ref {
				return dashboardVars().Replace(tg.Expr)
			}
		}
		t.Fatalf("panel %q has no query %s", w.title, w.ref)
		return ""
	}
	if p := byTitle["GPU utilization across the fleet"]; p.Type != "heatmap" || len(p.Targets) != 1 || p.Targets[0].Format != "heatmap" {
		t.Errorf("fleet utilization panel: type %q, targets %+v; want a heatmap panel over one query in heatmap format", p.Type, p.Targets)
	}
	fleetTitles := map[string]bool{}
	for _, w := range fleet {
		fleetTitles[w.title] = true
	}
	for title := range fleetTitles {
		var refs []string
		for _, w := range fleet {
			if w.title == title {
				refs = append(refs, w.ref)
			}
		}
		if n := len(byTitle[title].Targets); n != len(refs) {
			t.Errorf("panel %q has %d queries, the test checks %v", title, n, refs)
		}
	}

	var tests strings.Builder
	tests.WriteString("rule_files: []\nevaluation_interval: 1m\ntests:\n")
	group := func(series []struct{ series, values string }, wants []want) {
		tests.WriteString("  - interval: 1m\n    input_series:\n")
		for _, s := range series {
			q, _ := json.Marshal(s.series)
			fmt.Fprintf(&tests, "      - series: %s\n        values: %q\n", q, s.values)
		}
		tests.WriteString("    promql_expr_test:\n")
		for _, w := range wants {
			q, _ := json.Marshal(expr(w))
			fmt.Fprintf(&tests, "      - expr: %s\n        eval_time: 5m\n        exp_samples:\n", q)
			for _, labels := range slices.Sorted(maps.Keys(w.samples)) {
				fmt.Fprintf(&tests, "          - labels: %q\n            value: %v\n", labels, w.samples[labels])
			}
		}
	}
	group(fleetSeries, fleet)
	group(fleetSeries[len(fleetSeries)-7:], empty) // GPU utilization only

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not installed (make deps-prometheus): %v", err)
	}
	file := filepath.Join(t.TempDir(), "dashboard-fleet-test.yml")
	if err := os.WriteFile(file, []byte(tests.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "test", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("fleet queries give other answers: %v\n%s\n%s", err, out, tests.String())
	}
}

package chart

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// DashboardFile is the Grafana dashboard, relative to the root.
const DashboardFile = "deploy/grafana/gpu-node-agent.json"

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
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
}

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", DashboardFile, err)
	}
	served := servedMetrics(t)
	var exprs []string
	for _, p := range d.Panels {
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

	// promtool parses every query (as recording rules, variables expanded).
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skipf("promtool not installed (make deps-prometheus): %v", err)
	}
	vars := strings.NewReplacer("$node", ".*", "$gpu", ".*", "$instance", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(vars.Replace(e)) // a JSON string is a valid YAML scalar
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

package chart

import (
	"bytes"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// The alerting rules (deploy/prometheus/gpu-node-agent-rules.yaml), their
// runbooks (docs/runbooks), their unit tests (deploy/prometheus/tests) and
// the chart's PrometheusRule.

const (
	// RunbooksDir holds one runbook per alert, relative to the root.
	RunbooksDir = "docs/runbooks"
	// RulesTestsDir holds the rules' promtool unit tests.
	RulesTestsDir = "deploy/prometheus/tests"
	// defaultRunbookBase is the runbook_url prefix of the rules file (and
	// the chart's default metrics.prometheusRule.runbookBaseURL).
	defaultRunbookBase = "https://github.com/gpu-node-agent/gpu-node-agent/blob/main/docs/runbooks/"
)

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// loadRules reads the rules file: its groups as typed rules, and as plain
// values for exact comparisons.
func loadRules(t *testing.T) ([]ruleGroup, []any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, RulesFile))
	if err != nil {
		t.Fatal(err)
	}
	var typed struct {
		Groups []ruleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(b, &typed); err != nil {
		t.Fatalf("%s: %v", RulesFile, err)
	}
	var plain struct {
		Groups []any `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &plain); err != nil {
		t.Fatalf("%s: %v", RulesFile, err)
	}
	if len(typed.Groups) == 0 {
		t.Fatalf("%s has no groups", RulesFile)
	}
	return typed.Groups, plain.Groups
}

func alertRules(groups []ruleGroup) []rule {
	var out []rule
	for _, g := range groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// renderedRuleGroups renders the chart's PrometheusRule with vals (the
// rule enabled) and returns its groups as plain values.
func renderedRuleGroups(t *testing.T, vals map[string]any) []any {
	t.Helper()
	files := render(t, vals)
	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	text, ok := files["prometheusrule.yaml"]
	if !ok {
		t.Fatalf("prometheusrule.yaml not rendered (have %v)", keys(files))
	}
	if err := yaml.Unmarshal([]byte(text), &pr); err != nil {
		t.Fatalf("decode PrometheusRule: %v\n%s", err, text)
	}
	if pr.APIVersion != "monitoring.coreos.com/v1" || pr.Kind != "PrometheusRule" {
		t.Fatalf("rendered %s %s, want monitoring.coreos.com/v1 PrometheusRule", pr.APIVersion, pr.Kind)
	}
	return pr.Spec.Groups
}

func ruleValues(extra map[string]any) map[string]any {
	pr := map[string]any{"enabled": true}
	for k, v := range extra {
		pr[k] = v
	}
	return map[string]any{"metrics": map[string]any{"prometheusRule": pr}}
}

// replaceStrings applies r to every string in v (maps and lists walked).
func replaceStrings(v any, r *strings.Replacer) any {
	switch x := v.(type) {
	case string:
		return r.Replace(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = replaceStrings(e, r)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = replaceStrings(e, r)
		}
		return out
	}
	return v
}

// TestChartRulesCopy: the chart carries the rules file as it is (make
// manifests copies it); a stale copy fails here.
func TestChartRulesCopy(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(root, RulesFile))
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, ChartRulesFile))
	if err != nil {
		t.Fatalf("%v (run make manifests)", err)
	}
	if !bytes.Equal(got, ChartRules(src)) {
		t.Errorf("%s differs from %s (run make manifests)", ChartRulesFile, RulesFile)
	}
}

// TestPrometheusRuleIsTheRulesFile: with its defaults the chart renders
// exactly the groups of the rules file; the job, runbook and Grafana
// values change those three strings and nothing else.
func TestPrometheusRuleIsTheRulesFile(t *testing.T) {
	_, want := loadRules(t)
	if got := renderedRuleGroups(t, ruleValues(nil)); !reflect.DeepEqual(got, want) {
		gb, _ := yaml.Marshal(got)
		wb, _ := yaml.Marshal(want)
		t.Fatalf("the chart's PrometheusRule differs from %s:\n--- chart\n%s\n--- %s\n%s", RulesFile, gb, RulesFile, wb)
	}

	vals := ruleValues(map[string]any{
		"runbookBaseURL": "https://wiki.example.com/gpu/runbooks",
		"grafanaURL":     "https://grafana.example.com/",
	})
	vals["fullnameOverride"] = "gpu-agent"
	got := renderedRuleGroups(t, vals)
	r := strings.NewReplacer(
		`job="gpu-node-agent"`, `job="gpu-agent"`,
		defaultRunbookBase, "https://wiki.example.com/gpu/runbooks/",
		"/d/gpu-node-agent/gpu-node-agent?", "https://grafana.example.com/d/gpu-node-agent/gpu-node-agent?",
	)
	if exp := replaceStrings(want, r); !reflect.DeepEqual(got, exp) {
		gb, _ := yaml.Marshal(got)
		t.Fatalf("with other values the PrometheusRule changed more than the job, runbook and Grafana strings:\n%s", gb)
	}
	b, _ := yaml.Marshal(got)
	for _, s := range []string{`up{job="gpu-agent"} == 0`, "https://wiki.example.com/gpu/runbooks/GPUNodeAgentDown.md",
		"https://grafana.example.com/d/gpu-node-agent/gpu-node-agent?viewPanel=34"} {
		if !strings.Contains(string(b), s) {
			t.Errorf("rendered rules lack %s", s)
		}
	}
}

// TestPrometheusRuleValuesRefused: no runbook base is a render error that
// names the value.
func TestPrometheusRuleValuesRefused(t *testing.T) {
	_, err := Render(loadChart(t), ruleValues(map[string]any{"runbookBaseURL": ""}))
	if err == nil || !strings.Contains(err.Error(), "metrics.prometheusRule.runbookBaseURL") {
		t.Fatalf("render with an empty runbookBaseURL: %v; want an error naming metrics.prometheusRule.runbookBaseURL", err)
	}
}

// TestServiceMonitorLabelsNodes: the rules route by the node label, which
// the ServiceMonitor sets from the pod's node.
func TestServiceMonitorLabelsNodes(t *testing.T) {
	files := render(t, map[string]any{"metrics": map[string]any{"serviceMonitor": map[string]any{"enabled": true}}})
	var sm struct {
		Spec struct {
			Endpoints []struct {
				HonorLabels bool `json:"honorLabels"`
				Relabelings []struct {
					SourceLabels []string `json:"sourceLabels"`
					TargetLabel  string   `json:"targetLabel"`
				} `json:"relabelings"`
			} `json:"endpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal([]byte(files["servicemonitor.yaml"]), &sm); err != nil {
		t.Fatal(err)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %+v", sm.Spec.Endpoints)
	}
	ok := slices.ContainsFunc(sm.Spec.Endpoints[0].Relabelings, func(r struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
	}) bool {
		return r.TargetLabel == "node" && slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_node_name"})
	})
	if !ok {
		t.Errorf("ServiceMonitor relabelings %+v: no node label from __meta_kubernetes_pod_node_name", sm.Spec.Endpoints[0].Relabelings)
	}
}

var severities = []string{"critical", "warning", "info"}

// TestAlertRules: every alert has a for duration, a known severity, a
// summary and description, its runbook and a dashboard link; names are
// unique.
func TestAlertRules(t *testing.T) {
	groups, _ := loadRules(t)
	alerts := alertRules(groups)
	if len(alerts) < 20 {
		t.Fatalf("%d alerts; expected at least 20 (one per cause an operator acts on)", len(alerts))
	}
	seen := map[string]bool{}
	for _, a := range alerts {
		if seen[a.Alert] {
			t.Errorf("alert %s defined twice", a.Alert)
		}
		seen[a.Alert] = true
		if d, err := time.ParseDuration(a.For); err != nil || d <= 0 {
			t.Errorf("%s: for %q, want a positive duration", a.Alert, a.For)
		}
		if !slices.Contains(severities, a.Labels["severity"]) {
			t.Errorf("%s: severity %q, want one of %v", a.Alert, a.Labels["severity"], severities)
		}
		for _, k := range []string{"summary", "description", "runbook_url", "dashboard_url"} {
			if strings.TrimSpace(a.Annotations[k]) == "" {
				t.Errorf("%s: no %s annotation", a.Alert, k)
			}
		}
		if len(a.Annotations) != 4 {
			t.Errorf("%s: annotations %v, want summary, description, runbook_url, dashboard_url", a.Alert, keysOf(a.Annotations))
		}
	}
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// runbookRow is a row of docs/runbooks/README.md's index.
var runbookRow = regexp.MustCompile(`(?m)^\| \[(\w+)\]\((\w+)\.md\) \| (critical|warning|info) \|`)

// TestRunbooks: every alert's runbook_url is the runbook base plus
// <alert>.md; that file exists in docs/runbooks with the sections an
// on-call engineer needs; the index lists every alert with its severity;
// no runbook is left without an alert.
func TestRunbooks(t *testing.T) {
	groups, _ := loadRules(t)
	alerts := alertRules(groups)
	index, err := os.ReadFile(filepath.Join(root, RunbooksDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, m := range runbookRow.FindAllStringSubmatch(string(index), -1) {
		if m[1] != m[2] {
			t.Errorf("index row %s links %s.md", m[1], m[2])
		}
		listed[m[1]] = m[3]
	}
	names := map[string]bool{}
	for _, a := range alerts {
		names[a.Alert] = true
		if want := defaultRunbookBase + a.Alert + ".md"; a.Annotations["runbook_url"] != want {
			t.Errorf("%s: runbook_url %q, want %q", a.Alert, a.Annotations["runbook_url"], want)
		}
		b, err := os.ReadFile(filepath.Join(root, RunbooksDir, a.Alert+".md"))
		if err != nil {
			t.Errorf("%s: %v", a.Alert, err)
			continue
		}
		text := string(b)
		if !strings.HasPrefix(text, "# "+a.Alert+"\n") {
			t.Errorf("%s.md does not start with the title # %s", a.Alert, a.Alert)
		}
		for _, s := range []string{"## Meaning", "## Confirm", "## Act", "## When it clears"} {
			if !strings.Contains(text, "\n"+s+"\n") {
				t.Errorf("%s.md has no section %q", a.Alert, s)
			}
		}
		if !strings.Contains(text, "Severity: "+a.Labels["severity"]) {
			t.Errorf("%s.md does not say its severity (%s)", a.Alert, a.Labels["severity"])
		}
		if got, ok := listed[a.Alert]; !ok {
			t.Errorf("%s/README.md does not list %s", RunbooksDir, a.Alert)
		} else if got != a.Labels["severity"] {
			t.Errorf("%s/README.md gives %s severity %s, the rule %s", RunbooksDir, a.Alert, got, a.Labels["severity"])
		}
	}
	files, err := filepath.Glob(filepath.Join(root, RunbooksDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".md")
		if name != "README" && !names[name] {
			t.Errorf("%s is the runbook of no alert", f)
		}
	}
	for name := range listed {
		if !names[name] {
			t.Errorf("%s/README.md lists %s, which is no alert", RunbooksDir, name)
		}
	}
}

// alertMetric finds the metric names an expression or query reads.
var alertMetric = regexp.MustCompile(`\b(up|DCGM_FI_[A-Z0-9_]+|gpu_node_agent_[a-z0-9_]+)\b`)

// TestAlertPanels: every alert's dashboard_url opens a panel of the
// agent's dashboard (its uid, a panel that exists and is not a row) that
// charts a metric the alert reads.
func TestAlertPanels(t *testing.T) {
	groups, _ := loadRules(t)
	raw, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		UID string `json:"uid"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		t.Fatal(err)
	}
	d := loadDashboard(t)
	byID := map[int]panel{}
	for _, p := range d.allPanels() {
		if _, dup := byID[p.ID]; dup {
			t.Errorf("dashboard panel id %d used twice", p.ID)
		}
		byID[p.ID] = p
	}
	for _, a := range alertRules(groups) {
		u, err := url.Parse(a.Annotations["dashboard_url"])
		if err != nil {
			t.Errorf("%s: dashboard_url: %v", a.Alert, err)
			continue
		}
		if want := "/d/" + meta.UID + "/"; !strings.HasPrefix(u.Path, want) {
			t.Errorf("%s: dashboard_url %s is not on the dashboard %s", a.Alert, u, want)
		}
		id, err := strconv.Atoi(u.Query().Get("viewPanel"))
		if err != nil {
			t.Errorf("%s: dashboard_url %s names no viewPanel", a.Alert, u)
			continue
		}
		p, ok := byID[id]
		if !ok || p.Type == "row" {
			t.Errorf("%s: dashboard_url opens panel %d, which the dashboard does not have", a.Alert, id)
			continue
		}
		uses := map[string]bool{}
		for _, m := range alertMetric.FindAllString(a.Expr, -1) {
			uses[m] = true
		}
		charted := false
		for _, tg := range p.Targets {
			for _, m := range alertMetric.FindAllString(tg.Expr, -1) {
				charted = charted || uses[m]
			}
		}
		if !charted {
			t.Errorf("%s: panel %d (%q) charts none of %v", a.Alert, id, p.Title, keysOf(uses))
		}
	}
}

type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestEveryAlertIsUnitTested: the promtool tests load the rules file and
// check every alert both firing and not firing.
func TestEveryAlertIsUnitTested(t *testing.T) {
	groups, _ := loadRules(t)
	files, err := filepath.Glob(filepath.Join(root, RulesTestsDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no promtool tests in %s: %v", RulesTestsDir, err)
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var pt promtoolTests
		if err := yaml.Unmarshal(b, &pt); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if !slices.Equal(pt.RuleFiles, []string{"../" + filepath.Base(RulesFile)}) {
			t.Errorf("%s: rule_files %v, want the rules file", f, pt.RuleFiles)
		}
		for _, tc := range pt.Tests {
			for _, at := range tc.AlertRuleTest {
				if len(at.ExpAlerts) > 0 {
					firing[at.Alertname]++
				} else {
					quiet[at.Alertname]++
				}
			}
		}
	}
	names := map[string]bool{}
	for _, a := range alertRules(groups) {
		names[a.Alert] = true
		if firing[a.Alert] == 0 || quiet[a.Alert] == 0 {
			t.Errorf("%s: %d firing and %d not-firing promtool cases, want both", a.Alert, firing[a.Alert], quiet[a.Alert])
		}
	}
	for n := range firing {
		if !names[n] {
			t.Errorf("promtool tests expect alert %s, which no rule defines", n)
		}
	}
}

// TestRulesPromtool: promtool (Debian's prometheus package) checks the
// rules file and runs its unit tests, and checks the chart's rendered
// groups with non-default values.
func TestRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not installed (make deps-prometheus): %v", err)
	}
	rules := filepath.Join(root, RulesFile)
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", RulesFile, err, out)
	}
	tests, err := filepath.Glob(filepath.Join(root, RulesTestsDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, append([]string{"test", "rules"}, tests...)...).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
	vals := ruleValues(map[string]any{"grafanaURL": "https://grafana.example.com"})
	vals["fullnameOverride"] = "gpu-agent"
	b, err := yaml.Marshal(map[string]any{"groups": renderedRuleGroups(t, vals)})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "chart-rules.yaml")
	if err := os.WriteFile(f, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (chart, other values): %v\n%s", err, out)
	}
}

// AlertsDoc is the page that documents the alerts (what they watch, how
// to install the rules, the runbooks), relative to the root.
const AlertsDoc = "docs/metrics.md"

// TestAlertsDocumented: the README's operating section, the chart README
// and the alerts page point to the rules and runbooks, and the alerts page
// lists every alert of the rules with a link to its runbook.
func TestAlertsDocumented(t *testing.T) {
	for f, want := range map[string][]string{
		"README.md":             {RulesFile, RunbooksDir, AlertsDoc},
		ChartDir + "/README.md": {RulesFile, RunbooksDir},
		AlertsDoc:               {RulesFile, "runbooks/README.md"},
	} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range want {
			if !strings.Contains(string(b), s) {
				t.Errorf("%s does not mention %s", f, s)
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(root, AlertsDoc))
	if err != nil {
		t.Fatal(err)
	}
	groups, _ := loadRules(t)
	alerts := alertRules(groups)
	if len(alerts) == 0 {
		t.Fatal("no alert in the rules")
	}
	for _, a := range alerts {
		if link := "[" + a.Alert + "](runbooks/" + a.Alert + ".md)"; !strings.Contains(string(doc), link) {
			t.Errorf("%s does not list %s with its runbook (%s)", AlertsDoc, a.Alert, link)
		}
	}
}

// TestScrapeConfigExample: the scrape configuration deploy/prometheus's
// README gives users without the operator is one promtool accepts, with
// the rules file loaded. Debian's promtool is built without Kubernetes
// service discovery ("field kubernetes_sd_configs not found"), so the
// discovery block is swapped for a static target: the job, the relabelling
// and the rule file are what is checked.
func TestScrapeConfigExample(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not installed (make deps-prometheus): %v", err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg string
	for _, block := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(block[1], "scrape_configs:") {
			cfg = block[1]
		}
	}
	if cfg == "" {
		t.Fatal("deploy/prometheus/README.md has no yaml block with scrape_configs")
	}
	rules, err := filepath.Abs(filepath.Join(root, RulesFile))
	if err != nil {
		t.Fatal(err)
	}
	const example = "/etc/prometheus/rules/gpu-node-agent-rules.yaml"
	if !strings.Contains(cfg, example) || !strings.Contains(cfg, "job_name: gpu-node-agent") || !strings.Contains(cfg, "target_label: node") {
		t.Fatalf("the example does not load %s, name the job gpu-node-agent and set node:\n%s", example, cfg)
	}
	sd := regexp.MustCompile(`(?s)    kubernetes_sd_configs:\n.*?\n    relabel_configs:`)
	if !sd.MatchString(cfg) {
		t.Fatalf("the example has no kubernetes_sd_configs block before its relabel_configs:\n%s", cfg)
	}
	cfg = sd.ReplaceAllString(cfg, "    static_configs:\n      - targets: [\"127.0.0.1:9400\"]\n    relabel_configs:")
	f := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(f, []byte(strings.ReplaceAll(cfg, example, rules)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "config", f).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
}

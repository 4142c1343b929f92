package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// NVIDIA's reference artefacts, unmodified copies kept outside the
// repository (see their README): dcgm-exporter 4.5.3-4.8.2's Grafana
// dashboard and etc/default-counters.csv. They are never copied in.
const (
	realclientsDir    = "shared/realclients"
	nvidiaDashboard   = "dcgm-exporter-dashboard.json"
	nvidiaCountersCSV = "dcgm-exporter-default-counters.csv"
	// realclientsEnv names the references' directory. When it is set the
	// check is required: a missing directory or file fails the test
	// (CI sets it, so CI never skips the check silently).
	realclientsEnv = "GNA_REALCLIENTS_DIR"
	// realclientsReportEnv names a file the check appends one line to
	// when it has run and passed, for CI to confirm that it ran.
	realclientsReportEnv = "GNA_REALCLIENTS_REPORT"
)

// realclients returns the directory of NVIDIA's references: $GNA_REALCLIENTS_DIR
// (required to hold both files), else shared/realclients in the
// repository root or one of its parents. Without either it returns ""
// and the reason, and the caller skips the check: a fresh clone has no
// references beside it.
func realclients(t *testing.T) (dir, why string) {
	t.Helper()
	if dir = os.Getenv(realclientsEnv); dir != "" {
		for _, f := range []string{nvidiaDashboard, nvidiaCountersCSV} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Fatalf("%s=%s: %v", realclientsEnv, dir, err)
			}
		}
		return dir, ""
	}
	root := agentproc.RepoRoot()
	for d := root; ; d = filepath.Dir(d) {
		p := filepath.Join(d, realclientsDir)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p, ""
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	return "", fmt.Sprintf("no %s in %s or any parent and %s is not set: NVIDIA's dashboard and default counters are not in the repository", realclientsDir, root, realclientsEnv)
}

// dashboardQuery is one panel target of a Grafana dashboard.
type dashboardQuery struct {
	panel, expr string
}

// dashboardQueries reads every panel target's expression (rows nest
// panels) and the dashboard's template variable names and queries.
func dashboardQueries(t *testing.T, path string) (queries []dashboardQuery, vars map[string]string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var walk func([]json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("%s: panel: %v", path, err)
			}
			for _, tg := range p.Targets {
				if tg.Expr != "" {
					queries = append(queries, dashboardQuery{panel: p.Title, expr: tg.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	vars = map[string]string{}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(string); ok && v.Type == "query" {
			vars[v.Name] = q
		}
	}
	return queries, vars
}

// counterRow is one uncommented row of default-counters.csv.
type counterRow struct {
	field, typ, help string
}

// defaultCounters reads the rows of dcgm-exporter's csv that are switched
// on (not commented out): "DCGM FIELD, Prometheus metric type, help".
func defaultCounters(t *testing.T, path string) []counterRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []counterRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		parts := strings.SplitN(line, ",", 3)
		if len(parts) != 3 {
			t.Fatalf("%s: row %q has not 3 fields", path, line)
		}
		rows = append(rows, counterRow{field: strings.TrimSpace(parts[0]), typ: strings.TrimSpace(parts[1]), help: strings.TrimSpace(parts[2])})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no rows", path)
	}
	return rows
}

// grafanaVar matches $name, ${name} and ${name:format} and [[name]].
var grafanaVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]`)

// labelValuesQuery is a Grafana Prometheus variable query
// label_values(metric, label).
var labelValuesQuery = regexp.MustCompile(`^label_values\(\s*([^,]+?)\s*,\s*([A-Za-z0-9_]+)\s*\)$`)

// grafanaIntervals are Grafana's built-in interval variables as a
// dashboard with the default 1m minimum sees them with the 1s scrape:
// $__rate_interval is max($__interval + scrape interval, 4 × scrape
// interval).
var grafanaIntervals = map[string]string{
	"__interval": "1m", "__interval_ms": "60000", "__rate_interval": "1m", "__range": "5m", "__range_s": "300", "__range_ms": "300000",
}

// substitute replaces the dashboard's variables as Grafana does for a
// Prometheus data source with "All" selected on multi-value variables
// without an allValue: each value regex-escaped, joined as (a|b|c).
func substitute(expr string, values map[string][]string) (string, error) {
	var missing []string
	out := grafanaVar.ReplaceAllStringFunc(expr, func(m string) string {
		sub := grafanaVar.FindStringSubmatch(m)
		name := sub[1] + sub[2] + sub[3]
		if v, ok := grafanaIntervals[name]; ok {
			return v
		}
		vals, ok := values[name]
		if !ok {
			missing = append(missing, name)
			return m
		}
		esc := make([]string, len(vals))
		for i, v := range vals {
			// Grafana's prometheusRegularEscape: regex metacharacters
			// escaped with a backslash that is itself escaped for the
			// PromQL string literal ("127\\.0\\.0\\.1").
			esc[i] = strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
		}
		if len(esc) == 1 {
			return esc[0]
		}
		return "(" + strings.Join(esc, "|") + ")"
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("variables without a value: %v", missing)
	}
	return out, nil
}

// dashboardSkips are the panel queries of NVIDIA's dashboard that the
// agent cannot answer, with why. Each must match a query.
var dashboardSkips = map[string]string{
	"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "a DCGM profiling (DCP) field: NVML has no tensor-pipe counter; needs DCGM's profiling module (out of scope)",
}

// counterSkips are the switched-on rows of default-counters.csv the agent
// does not serve, with why; every DCGM_FI_PROF_ row is skipped as a
// profiling field. Each entry must match a row.
var counterSkips = map[string]string{}

// checkRealClients runs, against prom scraping the agent at target,
// every panel query of NVIDIA's dcgm-exporter dashboard (each must return
// a series) and every NVML-backed row of its default-counters.csv (each
// metric present with the csv's type and, on every series, the
// DCGM_FI_DRIVER_VERSION label of the csv's one "label" row).
// Without the references (a fresh clone) both subtests are skipped with
// one line saying why; the rest of the caller's test still runs.
func checkRealClients(ctx context.Context, t *testing.T, prom *cluster.Prometheus, target string) {
	dir, why := realclients(t)
	if dir == "" {
		t.Run("nvidia references", func(t *testing.T) {
			t.Skipf("dcgm-exporter dashboard and default counters not checked: %s", why)
		})
		return
	}
	var answered, skippedPanels, countersChecked int
	t.Run("dcgm-exporter dashboard queries", func(t *testing.T) {
		queries, vars := dashboardQueries(t, filepath.Join(dir, nvidiaDashboard))
		if len(queries) == 0 {
			t.Fatal("no panel queries in the dashboard")
		}
		// The variables' values, from their label_values queries, as
		// Grafana reads them (the series' label values).
		values := map[string][]string{}
		for name, q := range vars {
			m := labelValuesQuery.FindStringSubmatch(q)
			if m == nil {
				t.Fatalf("variable %s: query %q is not label_values(metric, label)", name, q)
			}
			var got []string
			vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := poll(vctx, func(ctx context.Context) (bool, error) {
				var err error
				got, err = labelValues(ctx, prom, m[2], m[1])
				return err == nil && len(got) > 0, nil
			})
			cancel()
			if err != nil {
				t.Fatalf("variable %s (%s) has no values: %v", name, q, err)
			}
			values[name] = got
		}
		if inst := values["instance"]; !slices.Contains(inst, target) {
			t.Errorf("$instance values %v do not hold the scraped agent %s", inst, target)
		}
		used := map[string]bool{}
		for _, q := range queries {
			expr, err := substitute(q.expr, values)
			if err != nil {
				t.Errorf("panel %q: %s: %v", q.panel, q.expr, err)
				continue
			}
			if skip, why := skipped(expr, dashboardSkips); skip != "" {
				used[skip] = true
				skippedPanels++
				t.Logf("skipped panel %q (%s): %s", q.panel, expr, why)
				continue
			}
			got, err := pollQuery(ctx, prom, expr)
			if err != nil {
				t.Errorf("panel %q: %s returns no series: %v", q.panel, expr, err)
				continue
			}
			answered++
			t.Logf("panel %q: %s: %d series", q.panel, expr, len(got))
		}
		for s := range dashboardSkips {
			if !used[s] {
				t.Errorf("dashboard skip %s matches no panel query: remove it", s)
			}
		}
	})
	t.Run("default counters", func(t *testing.T) {
		rows := defaultCounters(t, filepath.Join(dir, nvidiaCountersCSV))
		var labelRows []string
		for _, r := range rows {
			if r.typ == "label" {
				labelRows = append(labelRows, r.field)
			}
		}
		if len(labelRows) == 0 {
			t.Fatal("no label row in default-counters.csv")
		}
		used := map[string]bool{}
		checked := 0
		for _, r := range rows {
			switch {
			case r.typ == "label":
				continue
			case strings.HasPrefix(r.field, "DCGM_FI_PROF_"):
				t.Logf("skipped %s: a DCGM profiling (DCP) field, needs DCGM's profiling module (out of scope)", r.field)
				continue
			case counterSkips[r.field] != "":
				used[r.field] = true
				t.Logf("skipped %s: %s", r.field, counterSkips[r.field])
				continue
			}
			checked++
			sel := fmt.Sprintf(`%s{job="gpu-node-agent"}`, r.field)
			got, err := pollQuery(ctx, prom, sel)
			if err != nil {
				t.Errorf("%s (csv %s, %q): not scraped: %v", r.field, r.typ, r.help, err)
				continue
			}
			typ, err := metadataType(ctx, prom, r.field)
			if err != nil {
				t.Errorf("%s: %v", r.field, err)
			} else if typ != r.typ {
				t.Errorf("%s: type %s in prometheus, the csv says %s", r.field, typ, r.typ)
			}
			for _, l := range labelRows {
				// Every series must carry the label row as a label.
				bare, err := prom.Query(ctx, fmt.Sprintf(`%s unless %s{%s=~".+"}`, sel, r.field, l))
				if err != nil {
					t.Errorf("%s: %v", r.field, err)
				} else if len(bare) > 0 {
					t.Errorf("%s: %d of %d series lack the %s label: %v", r.field, len(bare), len(got), l, keys(bare))
				}
			}
			t.Logf("%s: %d series, type %s", r.field, len(got), typ)
		}
		for s := range counterSkips {
			if !used[s] {
				t.Errorf("counter skip %s matches no csv row: remove it", s)
			}
		}
		if checked == 0 {
			t.Error("no NVML-backed row checked")
		}
		countersChecked = checked
	})
	line := fmt.Sprintf("real clients (%s): %d dashboard queries answered, %d skipped; %d default counters checked", dir, answered, skippedPanels, countersChecked)
	t.Log(line)
	if report := os.Getenv(realclientsReportEnv); report != "" && !t.Failed() {
		f, err := os.OpenFile(report, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = fmt.Fprintln(f, line)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			t.Errorf("%s: %v", realclientsReportEnv, err)
		}
	}
}

// pollQuery runs the instant query q until it returns a series (the
// first scrapes may still be on their way), for up to 30s.
func pollQuery(ctx context.Context, prom *cluster.Prometheus, q string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got map[string]string
	var last error
	err := poll(ctx, func(ctx context.Context) (bool, error) {
		got, last = prom.Query(ctx, q)
		return last == nil && len(got) > 0, nil
	})
	if err != nil && last != nil {
		return nil, fmt.Errorf("%w; last query error: %v", err, last)
	}
	return got, err
}

// skipped returns the skip key expr mentions, and why.
func skipped(expr string, skips map[string]string) (string, string) {
	for k, why := range skips {
		if strings.Contains(expr, k) {
			return k, why
		}
	}
	return "", ""
}

// labelValues is /api/v1/label/<label>/values?match[]=<metric>, what
// Grafana's label_values(metric, label) asks.
func labelValues(ctx context.Context, prom *cluster.Prometheus, label, match string) ([]string, error) {
	var resp struct {
		Data []string `json:"data"`
	}
	if err := promGet(ctx, prom, "/api/v1/label/"+label+"/values?match[]="+url.QueryEscape(match), &resp); err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// metadataType is the type prometheus recorded for metric from the scrape
// (/api/v1/metadata).
func metadataType(ctx context.Context, prom *cluster.Prometheus, metric string) (string, error) {
	var resp struct {
		Data map[string][]struct {
			Type string `json:"type"`
		} `json:"data"`
	}
	if err := promGet(ctx, prom, "/api/v1/metadata?metric="+url.QueryEscape(metric), &resp); err != nil {
		return "", err
	}
	md := resp.Data[metric]
	if len(md) == 0 {
		return "", fmt.Errorf("no metadata in prometheus")
	}
	if len(md) > 1 {
		return "", fmt.Errorf("%d metadata entries in prometheus: %v", len(md), md)
	}
	return md[0].Type, nil
}

func promGet(ctx context.Context, prom *cluster.Prometheus, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prom.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prometheus %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

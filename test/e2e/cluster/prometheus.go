package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

// Prometheus is Debian's prometheus scraping static targets every second.
type Prometheus struct {
	// URL is the web/API address, "http://127.0.0.1:port".
	URL  string
	proc *process
}

// StartPrometheus runs prometheus with one scrape job (job name job) over
// targets ("host:port"), data and logs in the cluster directory; Stop
// ends it (it is also stopped with the cluster).
func (c *Cluster) StartPrometheus(ctx context.Context, job string, targets []string) (*Prometheus, error) {
	bin, err := lookPath("prometheus", "prometheus")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.Dir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create prometheus dir: %w", err)
	}
	quoted := make([]string, len(targets))
	for i, t := range targets {
		quoted[i] = strconv.Quote(t)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: %q
    static_configs:
      - targets: [%s]
`, job, strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("write prometheus config: %w", err)
	}
	port, err := freeport.Get()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := startProcess("prometheus", c.LogDir, bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	if err != nil {
		return nil, err
	}
	prom := &Prometheus{URL: "http://" + addr, proc: p}
	c.mu.Lock()
	c.extra = append(c.extra, p)
	c.mu.Unlock()
	if err := waitFor(ctx, "prometheus /-/ready", p, httpOK(prom.URL+"/-/ready")); err != nil {
		return nil, err
	}
	return prom, nil
}

// Stop stops prometheus.
func (p *Prometheus) Stop() error { return p.proc.stop(10 * time.Second) }

// Target is one scrape target's state from /api/v1/targets.
type Target struct {
	ScrapeURL string `json:"scrapeUrl"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// Targets returns the active targets.
func (p *Prometheus) Targets(ctx context.Context) ([]Target, error) {
	var resp struct {
		Data struct {
			ActiveTargets []Target `json:"activeTargets"`
		} `json:"data"`
	}
	if err := p.get(ctx, "/api/v1/targets", &resp); err != nil {
		return nil, err
	}
	return resp.Data.ActiveTargets, nil
}

// MetricNames returns every metric name prometheus has stored.
func (p *Prometheus) MetricNames(ctx context.Context) ([]string, error) {
	var resp struct {
		Data []string `json:"data"`
	}
	if err := p.get(ctx, "/api/v1/label/__name__/values", &resp); err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// Query runs an instant query and returns the samples' values by their
// label set (printed as prometheus does).
func (p *Prometheus) Query(ctx context.Context, q string) (map[string]string, error) {
	var resp struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(q), &resp); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, r := range resp.Data.Result {
		if len(r.Value) == 2 {
			out[fmt.Sprint(r.Metric)] = fmt.Sprint(r.Value[1])
		}
	}
	return out, nil
}

func (p *Prometheus) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prometheus %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("decode prometheus %s: %w", path, err)
	}
	return nil
}

package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

// prometheusBinary is Debian's prometheus (mk/metrics.mk installs it).
const prometheusBinary = "/usr/bin/prometheus"

// promAPI GETs a Prometheus HTTP API path and decodes its JSON answer.
func promAPI(ctx context.Context, base, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// TestPrometheusScrapesEndpoint runs a real Prometheus against the
// endpoint: the target must be up and DCGM_ and agent series queryable.
func TestPrometheusScrapesEndpoint(t *testing.T) {
	if _, err := os.Stat(prometheusBinary); err != nil {
		t.Skipf("%s not installed (make deps-prometheus installs it): %v", prometheusBinary, err)
	}
	target := strings.TrimPrefix(startServer(t, ServerConfig{}, nil), "http://")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: gpu-node-agent
    static_configs:
      - targets: [%q]
`, target)), 0o644); err != nil {
		t.Fatal(err)
	}
	web := freeport.Addr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prometheusBinary,
		"--config.file="+cfg,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+web,
		"--log.level=warn")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start prometheus: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("prometheus output:\n%s", logs.String())
		}
	})
	base := "http://" + web

	var targets struct {
		Data struct {
			ActiveTargets []struct {
				Health    string `json:"health"`
				LastError string `json:"lastError"`
				ScrapeURL string `json:"scrapeUrl"`
			} `json:"activeTargets"`
		} `json:"data"`
	}
	var query struct {
		Data struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
			} `json:"result"`
		} `json:"data"`
	}
	up, series := false, 0
	for ctx.Err() == nil && (!up || series == 0) {
		time.Sleep(200 * time.Millisecond)
		if err := promAPI(ctx, base, "/api/v1/targets", &targets); err != nil {
			continue // prometheus still starting
		}
		up = len(targets.Data.ActiveTargets) == 1 && targets.Data.ActiveTargets[0].Health == "up"
		q := url.QueryEscape(`DCGM_FI_DEV_GPU_TEMP{job="gpu-node-agent"}`)
		if err := promAPI(ctx, base, "/api/v1/query?query="+q, &query); err == nil {
			series = len(query.Data.Result)
		}
	}
	if !up {
		t.Fatalf("target never up: %+v", targets.Data.ActiveTargets)
	}
	if series != 2 {
		t.Fatalf("DCGM_FI_DEV_GPU_TEMP series in prometheus = %d, want 2", series)
	}
	if got := query.Data.Result[0].Metric["modelName"]; got != "NVIDIA H100 80GB HBM3" {
		t.Errorf("modelName label in prometheus = %q", got)
	}
	// Every NVML-backed row of dcgm-exporter's etc/default-counters.csv
	// (4.5.3-4.8.2) is scraped with the csv's type, and the csv's one
	// "label" row, DCGM_FI_DRIVER_VERSION, labels the series.
	// DCGM_FI_DEV_XID_ERRORS needs the health monitor (not wired here).
	for name, typ := range map[string]string{
		"DCGM_FI_DEV_SM_CLOCK": "gauge", "DCGM_FI_DEV_MEM_CLOCK": "gauge", "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
		"DCGM_FI_DEV_GPU_TEMP": "gauge", "DCGM_FI_DEV_POWER_USAGE": "gauge",
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
		"DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge", "DCGM_FI_DEV_ENC_UTIL": "gauge",
		"DCGM_FI_DEV_DEC_UTIL": "gauge", "DCGM_FI_DEV_FB_FREE": "gauge", "DCGM_FI_DEV_FB_USED": "gauge",
		"DCGM_FI_DEV_FB_RESERVED": "gauge", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
		"DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
		"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter", "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
	} {
		var meta struct {
			Data map[string][]struct {
				Type string `json:"type"`
			} `json:"data"`
		}
		if err := promAPI(ctx, base, "/api/v1/metadata?metric="+name, &meta); err != nil || len(meta.Data[name]) == 0 {
			t.Errorf("%s: no metadata in prometheus (err %v)", name, err)
		} else if got := meta.Data[name][0].Type; got != typ {
			t.Errorf("%s: type %s in prometheus, want %s", name, got, typ)
		}
		q := url.QueryEscape(name + `{job="gpu-node-agent",DCGM_FI_DRIVER_VERSION="570.172.08",pci_bus_id=~"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\\.[0-7]"}`)
		if err := promAPI(ctx, base, "/api/v1/query?query="+q, &query); err != nil || len(query.Data.Result) != 2 {
			t.Errorf("%s with driver version and NVML bus ID labels: %d series in prometheus, want 2 (err %v)", name, len(query.Data.Result), err)
		}
	}
	q := url.QueryEscape(`gpu_node_agent_build_info`)
	if err := promAPI(ctx, base, "/api/v1/query?query="+q, &query); err != nil || len(query.Data.Result) != 1 {
		t.Errorf("gpu_node_agent_build_info in prometheus: %d series, err %v", len(query.Data.Result), err)
	}
}

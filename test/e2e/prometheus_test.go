package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrometheusScrapesAgent: Debian's prometheus scrapes the agent's
// metrics endpoint on the node; the target is up and agent metrics arrive,
// every panel query of NVIDIA's dcgm-exporter dashboard returns series and
// every NVML-backed default counter is there with dcgm-exporter's type
// and the DCGM_FI_DRIVER_VERSION label (checkRealClients; skipped with a
// line saying why when NVIDIA's references are not beside the clone).
func TestPrometheusScrapesAgent(t *testing.T) {
	a := needAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := a.WaitReady(ctx, shared); err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("127.0.0.1:%d", a.MetricsPort)
	prom, err := shared.StartPrometheus(ctx, "gpu-node-agent", []string{target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := prom.Stop(); err != nil {
			t.Errorf("stop prometheus: %v", err)
		}
	})
	var last string
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		targets, err := prom.Targets(ctx)
		if err != nil || len(targets) != 1 {
			last = fmt.Sprintf("targets %v, err %v", targets, err)
			return false, nil
		}
		last = fmt.Sprintf("%s health=%s error=%q", targets[0].ScrapeURL, targets[0].Health, targets[0].LastError)
		return targets[0].Health == "up", nil
	})
	if err != nil {
		t.Fatalf("agent target not up: %v; last: %s", err, last)
	}
	var agentMetrics []string
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		names, err := prom.MetricNames(ctx)
		if err != nil {
			return false, nil
		}
		agentMetrics = agentMetrics[:0]
		for _, n := range names {
			if strings.HasPrefix(n, "gpu_node_agent_") {
				agentMetrics = append(agentMetrics, n)
			}
		}
		return len(agentMetrics) > 0, nil
	})
	if err != nil {
		t.Fatalf("no gpu_node_agent_* metric scraped: %v", err)
	}
	up, err := prom.Query(ctx, `up{job="gpu-node-agent"}`)
	if err != nil {
		t.Fatal(err)
	}
	for labels, v := range up {
		if v != "1" {
			t.Errorf("up%s = %s, want 1", labels, v)
		}
	}
	if len(up) != 1 {
		t.Errorf("up{job=\"gpu-node-agent\"} has %d series, want 1", len(up))
	}
	t.Logf("prometheus scraped %s: %d agent metrics, e.g. %v", target, len(agentMetrics), agentMetrics[:min(5, len(agentMetrics))])
	// NVIDIA's own clients of dcgm-exporter: its dashboard's queries and
	// its default counters, against what this prometheus scraped.
	checkRealClients(ctx, t, prom, target)
}

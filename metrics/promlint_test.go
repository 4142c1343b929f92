package metrics

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// dcgmCompatLint lists the promlint findings that dcgm-exporter
// compatibility forces on DCGM_ metrics, and nothing else: its counters
// have no lower-case _total suffix (one is even named _COUNTER) and its
// camelCase labels (modelName) are part of the contract dashboards rely on. Any other finding, and any finding on the agent's
// own gpu_node_agent_ metrics, fails the test.
var dcgmCompatLint = map[string]bool{
	`counter metrics should have "_total" suffix`:                   true,
	`metric name should not include type 'counter'`:                 true,
	`label names should be written in 'snake_case' not 'camelCase'`: true,
}

// testRegistry is a registry holding c and nothing else.
func testRegistry(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestPromlint(t *testing.T) {
	mn := newMockNode(t, 8, migLayout{0: {"3g.40gb", "2g.20gb", "1g.10gb"}})
	// One failing read so the error counter has a series to lint.
	mn.devs[7].GetPowerUsageFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
	reg := NewRegistry("v0.0.0-test")
	c, err := NewCollector(newSampler(t, mn.lib, mn.node, patientTimeout),
		Config{Hostname: "node-1", XIDs: fakeXIDs{}}, reg, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(mn.node)
	// H100s answer NOT_SUPPORTED for retired pages: the no-data gauge has
	// series to lint too.
	collectNow(t, c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "DCGM_FI_") && dcgmCompatLint[p.Text] {
			continue
		}
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	var own int
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "gpu_node_agent_") {
			own++
		}
	}
	// The pod-resources errors counter is the usage tracker's now, linted
	// with its metrics there.
	if own < 4 {
		t.Errorf("linted %d gpu_node_agent_ families, want build info, collection duration/errors, nvml field unavailable", own)
	}
}

package health

import (
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// eccCheck watches the volatile (since last reset) uncorrected ECC count:
// any rise over the count first seen makes the GPU unfit until a reset
// brings the count back down. Aggregate (lifetime) counts are exported.
type eccCheck struct {
	log *slog.Logger
	// baseline is the lowest volatile DBE count seen per GPU.
	baseline map[string]uint64
	counts   *prometheus.GaugeVec
}

func newECCCheck(reg prometheus.Registerer, log *slog.Logger) *eccCheck {
	c := &eccCheck{
		log:      log,
		baseline: map[string]uint64{},
		counts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpu_node_agent_ecc_errors",
			Help: "ECC error counts read by the health monitor, by device, type (single-bit, double-bit) and counter (volatile, aggregate).",
		}, []string{"device", "type", "counter"}),
	}
	if reg != nil {
		// A second monitor on the same registry (tests) just shares it.
		_ = reg.Register(c.counts)
	}
	return c
}

func (*eccCheck) Name() string { return CheckECC }

// forget deletes the ECC series of a GPU that has left the node. The
// baseline stays (it is touched only under the poll lock and is one
// integer per GPU ever seen); a GPU that comes back keeps its baseline.
func (c *eccCheck) forget(id string) {
	c.counts.DeletePartialMatch(prometheus.Labels{"device": id})
}

func (c *eccCheck) CheckDevice(t Target) []Observation {
	if cur, _, ret := t.Device.GetEccMode(); ret == nvml.SUCCESS && cur != nvml.FEATURE_ENABLED {
		return nil
	}
	for _, k := range []struct {
		typ     nvml.MemoryErrorType
		counter nvml.EccCounterType
		t, c    string
	}{
		{nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC, "single-bit", "aggregate"},
		{nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC, "double-bit", "aggregate"},
		{nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC, "single-bit", "volatile"},
	} {
		if n, ret := t.Device.GetTotalEccErrors(k.typ, k.counter); ret == nvml.SUCCESS {
			c.counts.WithLabelValues(t.UUID, k.t, k.c).Set(float64(n))
		}
	}
	vol, ret := t.Device.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	if ret != nvml.SUCCESS {
		if !ignorable(ret) {
			c.log.Debug("reading volatile ECC count", "device", t.UUID, "err", ret)
		}
		return nil
	}
	c.counts.WithLabelValues(t.UUID, "double-bit", "volatile").Set(float64(vol))
	base, seen := c.baseline[t.UUID]
	if !seen || vol < base {
		// First reading, or a reset cleared the counter: a new baseline.
		c.baseline[t.UUID] = vol
		base = vol
	}
	return []Observation{flag(t.UUID, CheckECC, "dbe", vol > base,
		fmt.Sprintf("%d volatile double-bit ECC errors", vol-base))}
}

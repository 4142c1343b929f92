package preflight

import (
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// checkThrottle: none of the counted clocks event reasons
// (throttle.reasons) active.
func checkThrottle(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemThrottle, g, "clocks event reasons", s.ClocksEventReasons); !ok {
		return r
	}
	var counted uint64
	for _, name := range cfg.Throttle.Reasons {
		bit, _ := nvmlapi.ClocksEventReasonBit(name) // Validate checked the names
		counted |= bit
	}
	mask := s.ClocksEventReasons.V
	bad := nvmlapi.ClocksEventReasonsIn(mask & counted)
	other := nvmlapi.ClocksEventReasonsIn(mask &^ counted)
	note := ""
	if len(other) > 0 {
		note = " (active, not counted: " + strings.Join(other, ", ") + ")"
	}
	if len(bad) > 0 {
		return g.result(ItemThrottle, Fail, "clocks held down by %s, want no reason of preflight.throttle.reasons active%s", strings.Join(bad, ", "), note)
	}
	return g.result(ItemThrottle, Pass, "no counted clocks event reason active%s", note)
}

package preflight

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/health"
)

// DCGMDiag runs DCGM's diagnostic; *health.DCGMDiag is the real one.
type DCGMDiag interface {
	RunDiag(ctx context.Context, level int) ([]health.DCGMDiagResult, error)
}

// checkDCGM runs the diagnostic at dcgm.level within dcgm.timeout: one
// failed result per failed test (on its GPU, or the node for the software
// tests), else one pass for the node. A "warn" is not a failure (DCGM's
// own verdict is non-fatal) and is named in the pass.
func checkDCGM(ctx context.Context, cfg Config, in *Inputs, gpus map[string]gpu) []Result {
	node := func(st Status, format string, a ...any) []Result {
		return []Result{{Item: ItemDCGM, Target: "node", Status: st, Detail: fmt.Sprintf(format, a...)}}
	}
	if in.DCGM == nil {
		why := "libdcgm not loaded or health.dcgmMode off"
		if in.DCGMErr != nil {
			why = in.DCGMErr.Error()
		}
		return node(Skipped, "no DCGM (%s)", why)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.DCGM.Timeout))
	defer cancel()
	res, err := in.DCGM.RunDiag(ctx, cfg.DCGM.Level)
	if err != nil {
		return node(Fail, "level %d did not run: %v", cfg.DCGM.Level, err)
	}
	var out []Result
	passed, skipped := 0, 0
	var warned []string
	for _, t := range res {
		switch t.Status {
		case "pass":
			passed++
			continue
		case "warn":
			warned = append(warned, t.Test)
			passed++
			continue
		case "fail":
		default:
			skipped++
			continue
		}
		r := Result{Item: ItemDCGM, Target: "node", Status: Fail}
		if g, ok := gpus[t.GPU]; ok {
			r.Target, r.Device = g.target(), g.uuid
		} else if t.GPU != "" {
			r.Target, r.Device = "GPU "+t.GPU, t.GPU
		}
		r.Detail = fmt.Sprintf("level %d test %q failed: %s", cfg.DCGM.Level, t.Test, orUnknown(strings.TrimSpace(t.Message)))
		out = append(out, r)
	}
	if len(out) > 0 {
		return out
	}
	detail := fmt.Sprintf("level %d: %d results passed, %d skipped or not run", cfg.DCGM.Level, passed, skipped)
	if len(warned) > 0 {
		detail += "; warnings from " + strings.Join(warned, ", ")
	}
	return node(Pass, "%s", detail)
}

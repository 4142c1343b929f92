package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// DCGMDiagResult is one test's result in a DCGM diagnostic run (dcgmi diag
// -r N).
type DCGMDiagResult struct {
	// Test is DCGM's test name ("software", "pcie", "memory", "sm stress",
	// ...).
	Test string
	// GPU is the UUID of the GPU the result is for; empty for results not
	// tied to one GPU (the software tests) or whose GPU DCGM cannot name.
	GPU string
	// Status is "pass", "fail", "warn", "skipped" or "notrun".
	Status string
	// Message is DCGM's error message (with its error code), else its
	// informational output.
	Message string
}

// DCGMDiag runs DCGM's diagnostic through the same DCGM the health
// watches use (health.dcgmMode, health.dcgmAddress). Only one run at a
// time is meaningful: DCGM serialises diagnostics on its host engine.
type DCGMDiag struct {
	cleanup func()
	log     *slog.Logger
}

// ErrDCGMOff is OpenDCGMDiag's error when health.dcgmMode is off.
var ErrDCGMOff = errDCGMOff

// OpenDCGMDiag starts (embedded) or connects to (standalone) DCGM as cfg
// says. Without libdcgm.so.4, or with dcgmMode off (ErrDCGMOff), it
// returns an error: the caller has no DCGM diagnostic.
func OpenDCGMDiag(cfg Config, log *slog.Logger) (*DCGMDiag, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cleanup, err := initDCGM(cfg.WithDefaults())
	if err != nil {
		return nil, err
	}
	return &DCGMDiag{cleanup: cleanup, log: log}, nil
}

// Close releases DCGM.
func (d *DCGMDiag) Close() { d.cleanup() }

// RunDiag runs the diagnostic at level 1 (r1, quick: the software and
// deployment checks, seconds), 2 (medium: adds PCIe and memory tests,
// about two minutes), 3 (long, about half an hour) or 4 (extended) on
// every GPU, as dcgmi diag -r LEVEL does. The DCGM call cannot be
// interrupted: when ctx ends first, RunDiag returns ctx's error and the
// run finishes (and is dropped) in the background.
func (d *DCGMDiag) RunDiag(ctx context.Context, level int) ([]DCGMDiagResult, error) {
	if level < 1 || level > 4 {
		return nil, fmt.Errorf("dcgm diagnostic level %d: want 1 to 4", level)
	}
	type answer struct {
		res dcgm.DiagResults
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := dcgm.RunDiag(dcgm.DiagType(level), dcgm.GroupAllGPUs())
		done <- answer{res, err}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		return nil, fmt.Errorf("dcgm diagnostic level %d: %w", level, ctx.Err())
	}
	if a.err != nil {
		return nil, fmt.Errorf("dcgm diagnostic level %d: %w", level, a.err)
	}
	uuids := map[uint]string{}
	out := make([]DCGMDiagResult, 0, len(a.res.Software))
	for _, r := range a.res.Software {
		res := DCGMDiagResult{Test: r.TestName, Status: r.Status, Message: r.ErrorMessage}
		if res.Message == "" {
			res.Message = r.TestOutput
		} else if r.ErrorCode != 0 {
			res.Message = fmt.Sprintf("%s (DCGM error %d)", res.Message, r.ErrorCode)
		}
		if r.TestName != "software" {
			uuid, ok := uuids[r.EntityID]
			if !ok {
				if info, err := dcgm.GetDeviceInfo(r.EntityID); err == nil {
					uuid = info.UUID
				} else {
					d.log.Debug("dcgm diagnostic result for a gpu without device info", "entity", r.EntityID, "err", err)
				}
				uuids[r.EntityID] = uuid
			}
			res.GPU = uuid
		}
		out = append(out, res)
	}
	if len(out) == 0 {
		return nil, errors.New("dcgm diagnostic returned no results")
	}
	return out, nil
}

package preflight

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// checkRowRemap: a pending row remap (Ampere and later) takes effect only
// at the next reset; a remap failure means the bank ran out of spare rows
// and the GPU needs service.
func checkRowRemap(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if s.RemapPending.Status == nvmlowner.NotSupported {
		return g.result(ItemRowRemap, Skipped, "row remapping not supported on this GPU (before Ampere, or MIG enabled)")
	}
	if r, ok := unread(ItemRowRemap, g, "remapped rows", s.RemapPending); !ok {
		return r
	}
	switch {
	case s.RemapFailure.V == 1:
		return g.result(ItemRowRemap, Fail, "row remap failure (no spare rows left), want none")
	case s.RemapPending.V == 1:
		return g.result(ItemRowRemap, Fail, "a row remap is pending, want none (needs a GPU reset)")
	}
	return g.result(ItemRowRemap, Pass, "no row remap pending or failed")
}

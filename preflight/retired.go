package preflight

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// checkRetiredPages: a page waiting for retirement (Kepler to Volta) is
// retired only at the next reset or driver reload; until then it can
// fault again.
func checkRetiredPages(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if s.RetiredPending.Status == nvmlowner.NotSupported {
		return g.result(ItemRetiredPages, Skipped, "page retirement not supported on this GPU (Ampere and later remap rows instead)")
	}
	if r, ok := unread(ItemRetiredPages, g, "retired pages pending status", s.RetiredPending); !ok {
		return r
	}
	if s.RetiredPending.V == 1 {
		return g.result(ItemRetiredPages, Fail, "a page is pending retirement, want none (needs a GPU reset)")
	}
	return g.result(ItemRetiredPages, Pass, "no page pending retirement")
}

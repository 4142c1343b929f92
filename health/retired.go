package health

import (
	"fmt"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// checkRetired reads dynamic page retirement (pre-Ampere GPUs; later ones
// answer NOT_SUPPORTED and use row remapping): pages pending retirement
// need a reset, and more retired pages than the limit means the GPU should
// be replaced.
func checkRetired(in *checkInput, out *checkResult) {
	if p, has := ok(in.Cur, nvmlowner.FieldRetiredPending); has {
		out.add(flag(in.UUID, CheckRetired, "pending", p == 1, "retired pages pending (reset required)"))
	}
	sbe, has1 := ok(in.Cur, nvmlowner.FieldRetiredSBE)
	dbe, has2 := ok(in.Cur, nvmlowner.FieldRetiredDBE)
	if has1 && has2 {
		n := sbe + dbe
		limit := uint64(in.Cfg.RetiredPagesLimit)
		out.add(flag(in.UUID, CheckRetired, "limit", n > limit, fmt.Sprintf("%d retired pages (limit %d)", n, limit)))
	}
}

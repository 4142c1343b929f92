package health

import (
	"fmt"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// baselineDBE is the baseline key of the volatile double-bit ECC count.
const baselineDBE = "ecc-dbe-volatile"

// checkECC watches the volatile (since the last driver load or GPU reset)
// uncorrected ECC count against a persisted baseline: any rise makes the
// GPU unfit until a reset (an uncorrectable error needs one: XID 48 is
// the same fault as an event), so the cause is held. A count below the
// baseline means the counter was reset, which checkReset reports as
// evidence; the count then becomes the new baseline. The baseline is
// persisted with the health state, so errors counted before an agent
// restart still count after it. ECC switched off says nothing.
func checkECC(in *checkInput, out *checkResult) {
	if mode, has := ok(in.Cur, nvmlowner.FieldECCMode); has && mode == 0 {
		return
	}
	vol, has := ok(in.Cur, nvmlowner.FieldECCDBEVolatile)
	if !has {
		return
	}
	base, seen := in.Baselines[baselineDBE]
	if !seen || vol < base {
		out.setBaseline(baselineDBE, vol)
		base = vol
	}
	o := flag(in.UUID, CheckECC, "dbe", vol > base, fmt.Sprintf("%d volatile double-bit ECC errors", vol-base))
	o.HoldUntilReset = o.Fatal
	out.add(o)
}

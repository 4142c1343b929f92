package health

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// checkRemap reads row remapping (Ampere and later; earlier GPUs answer
// NOT_SUPPORTED): a pending remap needs a GPU reset before the memory is
// trusted again, and a remap failure means the GPU has run out of spare
// rows. Both make the GPU unfit while NVML reports them.
func checkRemap(in *checkInput, out *checkResult) {
	if p, has := ok(in.Cur, nvmlowner.FieldRemapPending); has {
		out.add(flag(in.UUID, CheckRemap, "pending", p == 1, "row remapping pending (reset required)"))
	}
	if f, has := ok(in.Cur, nvmlowner.FieldRemapFailure); has {
		out.add(flag(in.UUID, CheckRemap, "failure", f == 1, "row remapping failure"))
	}
}

package preflight

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// checkECC: ECC on now and after the next reboot (the pending mode), on
// GPUs that have it (nvml.h: "Only applicable to devices with ECC").
func checkECC(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemECC, g, "ECC mode", s.ECCCurrent); !ok {
		return r
	}
	cur, pending := s.ECCCurrent.V, s.ECCPending.V
	pendingOK := s.ECCPending.Status == nvmlowner.OK
	switch {
	case cur != 1 && pendingOK:
		return g.result(ItemECC, Fail, "ECC %s (pending %s), want enabled", enabledWord(cur), enabledWord(pending))
	case cur != 1:
		return g.result(ItemECC, Fail, "ECC %s, want enabled", enabledWord(cur))
	case pendingOK && pending != 1:
		return g.result(ItemECC, Fail, "ECC enabled, but pending disabled: off after the next reboot")
	}
	return g.result(ItemECC, Pass, "ECC enabled")
}

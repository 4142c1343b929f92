package preflight

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// checkPersistence: nvidia-persistenced keeps the driver's state while no
// client is open; without it the first CUDA call of every pod pays the
// GPU's initialisation and a GPU's error state can be torn down with the
// last client.
func checkPersistence(_ Config, g gpu, s *nvmlowner.PreflightSample) Result {
	if r, ok := unread(ItemPersistence, g, "persistence mode", s.Persistence); !ok {
		return r
	}
	if s.Persistence.V != 1 {
		return g.result(ItemPersistence, Fail, "persistence mode disabled, want enabled (nvidia-persistenced)")
	}
	return g.result(ItemPersistence, Pass, "persistence mode enabled")
}

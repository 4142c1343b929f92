package preflight

import "github.com/gpu-node-agent/gpu-node-agent/nvmlowner"

// gpuItem judges one GPU's sample (whose Err is nil).
type gpuItem func(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result

// gpuItems are the per-GPU items by name (GPUItems lists their order).
var gpuItems = map[string]gpuItem{
	ItemPersistence:  checkPersistence,
	ItemECC:          checkECC,
	ItemRetiredPages: checkRetiredPages,
	ItemRowRemap:     checkRowRemap,
	ItemPCIe:         checkPCIe,
	ItemNVLink:       checkNVLink,
	ItemFabric:       checkFabric,
	ItemThrottle:     checkThrottle,
}

package health

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// retiredCheck reads dynamic page retirement (pre-Ampere GPUs; later ones
// return NOT_SUPPORTED and use row remapping): pages pending retirement
// need a reset, and more retired pages than the limit means the GPU should
// be replaced.
type retiredCheck struct {
	limit int
}

func (*retiredCheck) Name() string { return CheckRetired }

func (c *retiredCheck) CheckDevice(t Target) []Observation {
	var obs []Observation
	if pending, ret := t.Device.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS {
		obs = append(obs, flag(t.UUID, CheckRetired, "pending", pending == nvml.FEATURE_ENABLED, "retired pages pending (reset required)"))
	}
	sbe, ret1 := t.Device.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
	dbe, ret2 := t.Device.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
	if ret1 == nvml.SUCCESS && ret2 == nvml.SUCCESS {
		n := len(sbe) + len(dbe)
		obs = append(obs, flag(t.UUID, CheckRetired, "limit", n > c.limit,
			fmt.Sprintf("%d retired pages (limit %d)", n, c.limit)))
	}
	return obs
}

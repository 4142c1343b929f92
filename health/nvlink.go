package health

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvlinkCheck watches each NVLink of a GPU: a link that was seen up going
// down makes the GPU unfit until it is up again, and a jump of its replay,
// recovery or CRC error counters within one poll is a fault event. Links
// never seen up (absent or unused) are ignored.
type nvlinkCheck struct {
	jump uint64
	up   map[string]map[int]bool
	errs map[string]map[int]uint64
}

func newNVLinkCheck(jump uint64) *nvlinkCheck {
	return &nvlinkCheck{jump: jump, up: map[string]map[int]bool{}, errs: map[string]map[int]uint64{}}
}

func (*nvlinkCheck) Name() string { return CheckNVLink }

var nvlinkCounters = []nvml.NvLinkErrorCounter{
	nvml.NVLINK_ERROR_DL_REPLAY, nvml.NVLINK_ERROR_DL_RECOVERY, nvml.NVLINK_ERROR_DL_CRC_FLIT, nvml.NVLINK_ERROR_DL_CRC_DATA,
}

func (c *nvlinkCheck) CheckDevice(t Target) []Observation {
	if c.up[t.UUID] == nil {
		c.up[t.UUID] = map[int]bool{}
		c.errs[t.UUID] = map[int]uint64{}
	}
	seen, errs := c.up[t.UUID], c.errs[t.UUID]
	var obs []Observation
	for link := range nvml.NVLINK_MAX_LINKS {
		state, ret := t.Device.GetNvLinkState(link)
		if ret != nvml.SUCCESS {
			continue
		}
		key := "link " + strconv.Itoa(link)
		up := state == nvml.FEATURE_ENABLED
		_, wasSeen := seen[link]
		if !up && !wasSeen {
			continue
		}
		seen[link] = true
		obs = append(obs, flag(t.UUID, CheckNVLink, key, !up, fmt.Sprintf("nvlink %d down", link)))
		if !up {
			continue
		}
		var total uint64
		ok := true
		for _, ctr := range nvlinkCounters {
			n, ret := t.Device.GetNvLinkErrorCounter(link, ctr)
			if ret != nvml.SUCCESS {
				ok = false
				break
			}
			total += n
		}
		if !ok {
			continue
		}
		if prev, had := errs[link]; had && total > prev && total-prev >= c.jump {
			obs = append(obs, Observation{DeviceID: t.UUID, Kind: KindGPU, Check: CheckNVLink, Key: key + " errors",
				Fatal: true, Event: true, Reason: fmt.Sprintf("nvlink %d errors rose by %d", link, total-prev)})
		}
		errs[link] = total
	}
	return obs
}

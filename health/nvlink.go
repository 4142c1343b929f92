package health

import (
	"fmt"
	"strconv"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// baselineLinkUp is the baseline key recording that NVLink l was once seen
// up (persisted, so a link down at the agent's restart is still known).
func baselineLinkUp(l int) string { return "nvlink-up-" + strconv.Itoa(l) }

// checkNVLink watches each NVLink of a GPU. A link is expected up when the
// GPU's model wires it on the board (links 0..ExpectedNVLinks-1, from
// expectedNVLinks) or when it was ever seen up; such a link that is down
// makes the GPU unfit until it is up again, even if this agent never saw
// it up. A rise of the link's error counters (replay, recovery, CRC flit
// and data) between two samples of at least NVLinkErrorJump is a fault
// event. Each counter counts on its own: the ones the GPU answers
// NOT_SUPPORTED for are left out, never the link; on Blackwell, where all
// four are, the NVLink5 recovery event count stands in for them.
func checkNVLink(in *checkInput, out *checkResult) {
	prev := map[int]nvmlowner.Link{}
	if in.Prev != nil {
		for _, l := range in.Prev.Links {
			prev[l.Link] = l
		}
	}
	for _, l := range in.Cur.Links {
		if l.Up.Status != nvmlowner.OK {
			continue
		}
		up := l.Up.V == 1
		_, seen := in.Baselines[baselineLinkUp(l.Link)]
		if up && !seen {
			out.setBaseline(baselineLinkUp(l.Link), 1)
		}
		if !up && !seen && l.Link >= in.ExpectedNVLinks {
			// Not wired on this board (or unknown model): absent, not down.
			continue
		}
		key := "link " + strconv.Itoa(l.Link)
		out.add(flag(in.UUID, CheckNVLink, key, !up, fmt.Sprintf("nvlink %d down", l.Link)))
		p, had := prev[l.Link]
		if !up || !had {
			continue
		}
		rise := linkErrorRise(l, p)
		if rise > 0 && rise >= in.Cfg.NVLinkErrorJump {
			out.add(Observation{DeviceID: in.UUID, Kind: KindGPU, Check: CheckNVLink, Key: key + " errors",
				Fatal: true, Event: true, Reason: fmt.Sprintf("nvlink %d errors rose by %d", l.Link, rise)})
		}
	}
}

// linkErrorRise is how much link l's error counters (replay, recovery, CRC
// flit and data, the NVLink5 recovery event count) rose since p, the same
// link's previous sample; a counter either sample lacks, or that dropped
// (a reset), adds nothing. The rate window (correlate.go) sums it too.
func linkErrorRise(l, p nvmlowner.Link) uint64 {
	var rise uint64
	for i, c := range append(l.Counters[:], l.Recoveries) {
		pc := p.Recoveries
		if i < len(p.Counters) {
			pc = p.Counters[i]
		}
		if c.Status == nvmlowner.OK && pc.Status == nvmlowner.OK && c.V > pc.V {
			rise += c.V - pc.V
		}
	}
	return rise
}

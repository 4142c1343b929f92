package preflight

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// checkRDMA: every port of every configured RDMA resource ACTIVE/LinkUp,
// its interfaces up, at rdma.minRateGbps (default: the fastest rate among
// the resource's own ports).
func checkRDMA(cfg Config, in *Inputs) []Result {
	node := func(st Status, format string, a ...any) []Result {
		return []Result{{Item: ItemRDMA, Target: "node", Status: st, Detail: fmt.Sprintf(format, a...)}}
	}
	switch {
	case len(in.RDMAResources) == 0:
		return node(Skipped, "no RDMA resource configured (rdma.resources)")
	case in.RDMAErr != nil:
		return node(Fail, "RDMA devices not discovered: %v", in.RDMAErr)
	}
	ports := rdma.ResourcePorts(in.RDMADevices, in.RDMAResources)
	fastest := map[string]uint64{}
	for _, p := range ports {
		fastest[p.Resource] = max(fastest[p.Resource], p.Port.Rate)
	}
	var out []Result
	for _, p := range ports {
		r := Result{Item: ItemRDMA, Target: p.Resource + " " + p.ID, Device: p.ID, Status: Pass}
		gbps := float64(p.Port.Rate) * 8 / 1e9
		want, from := cfg.RDMA.MinRateGbps, "preflight.rdma.minRateGbps"
		if want == 0 {
			want, from = float64(fastest[p.Resource])*8/1e9, "the resource's fastest port"
		}
		seen := fmt.Sprintf("%s/%s at %s Gb/s", orUnknown(p.Port.State), orUnknown(p.Port.PhysState), formatGbps(gbps))
		var problems []string
		if up, why := p.Port.Up(); !up {
			problems = append(problems, why+", want ACTIVE/LinkUp")
		}
		for _, nd := range p.NetDevs {
			if !nd.Up() {
				problems = append(problems, fmt.Sprintf("interface %s is %s, want up", nd.Name, orUnknown(nd.OperState)))
			}
		}
		if gbps < want {
			problems = append(problems, fmt.Sprintf("rate below %s Gb/s (%s)", formatGbps(want), from))
		}
		r.Detail = seen
		if len(problems) > 0 {
			r.Status, r.Detail = Fail, seen+": "+strings.Join(problems, "; ")
		}
		out = append(out, r)
	}
	for _, c := range in.RDMAResources {
		name := rdma.ResourcePrefix + c.Name
		if _, any := fastest[name]; !any {
			out = append(out, Result{Item: ItemRDMA, Target: name, Status: Fail, Detail: "selects no port, want at least one"})
		}
	}
	return out
}

func formatGbps(g float64) string { return strconv.FormatFloat(g, 'f', -1, 64) }

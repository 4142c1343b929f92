package agent

import (
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// inventory prints what the agent serves, in plain text, whenever it
// changes. It stands in for asking the kubelet where there is none (the
// demo); the output is for people, not for parsing.
type inventory struct {
	out  io.Writer
	what string
	// fit, if set, says whether the node is fit and why not.
	fit func() (bool, []string)

	mu   sync.Mutex
	last string
	n    int
}

// report prints st unless it reads exactly as the last one printed.
func (v *inventory) report(st state) {
	text := v.render(st)
	v.mu.Lock()
	defer v.mu.Unlock()
	if text == v.last {
		return
	}
	v.last = text
	v.n++
	title := "serving"
	if v.n > 1 {
		title = "changed, now serving"
	}
	fmt.Fprintf(v.out, "=== gpu-node-agent on %s: %s ===\n%s\n", v.what, title, text)
}

func (v *inventory) render(st state) string {
	var b bytes.Buffer
	rs := append([]plugin.Resource(nil), st.resources...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Name() < rs[j].Name() })

	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tDEVICES\tHEALTHY\tPER NUMA NODE")
	devs := make([][]plugin.Device, len(rs))
	for i, r := range rs {
		devs[i] = r.Devices()
		healthy := 0
		perNUMA := map[string]int{}
		for _, d := range devs[i] {
			if d.Healthy {
				healthy++
			}
			perNUMA[numaString(d.NUMANodes)]++
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", r.Name(), len(devs[i]), healthy, numaSummary(perNUMA))
	}
	if len(rs) == 0 {
		fmt.Fprintln(tw, "(none)\t0\t0\t")
	}
	tw.Flush()

	fmt.Fprintln(&b)
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tDEVICE\tON\tHEALTH\tNUMA")
	where := placement(st.node)
	for i, r := range rs {
		for _, d := range devs[i] {
			health := "healthy"
			if !d.Healthy {
				health = "UNHEALTHY"
			}
			// A time-sliced replica is on the device it shares.
			on := where[gpu.SharedUUID(d.ID)]
			if on == "" {
				on = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name(), d.ID, on, health, numaString(d.NUMANodes))
		}
	}
	tw.Flush()

	if v.fit != nil {
		if ok, why := v.fit(); ok {
			fmt.Fprintln(&b, "\nNODE: fit")
		} else {
			fmt.Fprintln(&b, "\nNODE: UNFIT")
			for _, w := range why {
				fmt.Fprintf(&b, "  %s\n", w)
			}
		}
	}
	if len(st.errs) > 0 {
		names := make([]string, 0, len(st.errs))
		for name := range st.errs {
			names = append(names, name)
		}
		sort.Strings(names)
		fmt.Fprintln(&b, "\nNOT SERVED:")
		for _, name := range names {
			fmt.Fprintf(&b, "  %s: %v\n", name, st.errs[name])
		}
	}
	return b.String()
}

// placement says where each GPU and MIG device of node sits, for people:
// "GPU 3", or "GPU 0 MIG 2" (the MIG device index on its parent).
func placement(node *topology.Node) map[string]string {
	where := map[string]string{}
	if node == nil {
		return where
	}
	for _, g := range node.GPUs {
		where[g.UUID] = fmt.Sprintf("GPU %d", g.Index)
		for _, m := range g.MIG {
			where[m.UUID] = fmt.Sprintf("GPU %d MIG %d", g.Index, m.Index)
		}
	}
	return where
}

func numaString(nodes []int64) string {
	if len(nodes) == 0 {
		return "none"
	}
	s := make([]string, len(nodes))
	for i, n := range nodes {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

// numaSummary reads like "0:4 1:4" (NUMA node: devices).
func numaSummary(per map[string]int) string {
	keys := make([]string, 0, len(per))
	for k := range per {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, per[k])
	}
	return strings.Join(parts, " ")
}

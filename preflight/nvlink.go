package preflight

import (
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// checkNVLink: links 0..n-1 up, n from nvlink.expected or what the GPU's
// model wires on its board (topology.ExpectedNVLinks). A link NVML does
// not list at all is down too: the model says it is there.
func checkNVLink(cfg Config, g gpu, s *nvmlowner.PreflightSample) Result {
	expected := cfg.NVLink.Expected
	from := "nvlink.expected"
	if expected == 0 {
		expected = topology.ExpectedNVLinks(g.model)
		from = g.model
	}
	if expected == 0 {
		return g.result(ItemNVLink, Skipped, "no NVLink expected (%s wires none; set preflight.nvlink.expected)", orUnknownModel(g.model))
	}
	byLink := map[int]nvmlowner.Value{}
	for _, l := range s.NVLinks {
		byLink[l.Link] = l.Up
	}
	var down, unreadable []string
	for l := range expected {
		v, ok := byLink[l]
		switch {
		case !ok || (v.Status == nvmlowner.OK && v.V != 1):
			down = append(down, strconv.Itoa(l))
		case v.Status != nvmlowner.OK:
			unreadable = append(unreadable, strconv.Itoa(l))
		}
	}
	switch {
	case len(down) > 0:
		return g.result(ItemNVLink, Fail, "NVLink %s down; %d of %d expected up (%s)", strings.Join(down, ", "), expected-len(down)-len(unreadable), expected, from)
	case len(unreadable) > 0:
		return g.result(ItemNVLink, Fail, "NVLink %s state not read; want %d up (%s)", strings.Join(unreadable, ", "), expected, from)
	}
	return g.result(ItemNVLink, Pass, "%d of %d NVLinks up", expected, expected)
}

func orUnknownModel(m string) string {
	if m == "" {
		return "an unknown model"
	}
	return m
}

package health

import (
	"context"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// attachSampler gives m a sampler over its owner sampling node's GPUs every
// interval; tests run it or drive it with pollOnce.
func attachSampler(t testing.TB, m *Monitor, node *topology.Node, interval time.Duration) *nvmlowner.Sampler {
	t.Helper()
	s := nvmlowner.NewSampler(m.owner, nvmlowner.SamplerConfig{Interval: interval})
	s.SetTargets(nvmlowner.TargetsOf(node))
	m.SetSampler(s)
	return s
}

// pollOnce takes one sample of every GPU and runs the checks on it, as
// the poll loop does after each sampling cycle.
func (m *Monitor) pollOnce() {
	if m.sampler == nil {
		return
	}
	m.applySnapshot(m.sampler.SampleNow(context.Background()))
}

// ownerOf is an NVML owner over lib (go-nvml's mocks, as the real library
// through nvmlapi.Wrap) with the default call timeout.
func ownerOf(lib nvml.Interface) *nvmlowner.Owner {
	return nvmlowner.New(nvmlapi.Wrap(lib), nvmlowner.Config{}, discard())
}

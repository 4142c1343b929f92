package health

import (
	"context"
	"fmt"
	"maps"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// SetSampler gives the monitor the sampler whose snapshots its polled
// checks run on. Call it before Run; without one the monitor has only its
// events and external observations.
func (m *Monitor) SetSampler(s *nvmlowner.Sampler) { m.sampler = s }

// pollLoop runs the polled checks on every snapshot the sampler publishes,
// off every gRPC and scrape path. The monitor never reads NVML for them.
func (m *Monitor) pollLoop(ctx context.Context) {
	if m.sampler == nil {
		<-ctx.Done()
		return
	}
	// Every snapshot, in order: reset evidence is a change between two
	// consecutive samples, which applying only the latest could skip.
	ch := m.sampler.Snapshots(64)
	m.applySnapshot(m.sampler.Latest())
	for {
		select {
		case <-ctx.Done():
			return
		case snap := <-ch:
			m.applySnapshot(snap)
		}
	}
}

// applySnapshot runs every polled check on one sampling cycle: the
// node-wide NVML verdict, then each GPU's checks against its previous
// sample and its baselines. A cycle in which the library answered counts
// as the full poll that re-verifies a node whose state file was unusable.
func (m *Monitor) applySnapshot(snap *nvmlowner.Snapshot) {
	if snap == nil {
		return
	}
	m.pollMu.Lock()
	defer m.pollMu.Unlock()
	if snap.Seq != 0 && snap.Seq <= m.lastSeq {
		return
	}
	m.lastSeq = snap.Seq
	m.Observe(nvmlObservation(snap))
	byUUID := map[string]topology.GPU{}
	for _, g := range m.gpuList() {
		byUUID[g.UUID] = g
	}
	for i := range snap.Samples {
		s := &snap.Samples[i]
		g, known := byUUID[s.UUID]
		if !known {
			// Sampled before the GPU left the node model.
			continue
		}
		in := &checkInput{
			UUID:            s.UUID,
			Prev:            m.prev[s.UUID],
			Cur:             s,
			Cfg:             m.cfg,
			Baselines:       m.baselinesOf(s.UUID),
			ExpectedNVLinks: topology.ExpectedNVLinks(g.Model),
		}
		res := m.runChecks(in)
		res.add(m.nvlinkRate(in)...)
		for k, v := range res.Baselines {
			m.SetBaseline(s.UUID, k, v)
		}
		for _, o := range res.Obs {
			// What the checks report is what NVML said when the GPU was
			// sampled, which may be well before now (a cycle held back
			// while NVML was released for a GPU reset).
			o.At = s.Time
			m.Observe(o)
		}
		m.prev[s.UUID] = s
	}
	for uuid := range m.prev {
		if _, known := byUUID[uuid]; !known {
			delete(m.prev, uuid)
		}
	}
	if snap.LibErr == nil && len(snap.Samples) > 0 {
		m.Verified()
	}
}

// runChecks keeps a bug in one check from taking down the agent: it is
// logged and that GPU's checks skipped for this cycle.
func (m *Monitor) runChecks(in *checkInput) (res checkResult) {
	defer func() {
		if r := recover(); r != nil {
			m.log.Error("health check panicked", "device", in.UUID, "panic", fmt.Sprint(r))
			res = checkResult{}
		}
	}()
	return runSampleChecks(in)
}

// baselinesOf is a copy of GPU uuid's baselines.
func (m *Monitor) baselinesOf(uuid string) map[string]uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.baselines[uuid])
}

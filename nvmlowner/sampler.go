package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// DefaultSampleInterval is the sampling period when SamplerConfig.Interval
// is zero.
const DefaultSampleInterval = 10 * time.Second

// Target is one GPU to sample and the MIG devices to read under it.
type Target struct {
	UUID string
	MIG  []MIGTarget
}

// TargetsOf is what the sampler must read for node n (nil: nothing): every
// GPU by UUID, with its MIG devices by UUID and MIG handle index. The agent
// passes it to SetTargets after every discovery.
func TargetsOf(n *topology.Node) []Target {
	if n == nil {
		return nil
	}
	targets := make([]Target, 0, len(n.GPUs))
	for _, g := range n.GPUs {
		t := Target{UUID: g.UUID}
		for _, m := range g.MIG {
			t.MIG = append(t.MIG, MIGTarget{UUID: m.UUID, Index: m.Index, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance})
		}
		targets = append(targets, t)
	}
	return targets
}

// MIGTarget is a MIG device by UUID and its MIG handle index under its
// parent (GetMigDeviceHandleByIndex), with the GPU and compute instance
// IDs that the parent's process lists name it by (nvmlProcessInfo_t
// gpuInstanceId, computeInstanceId).
type MIGTarget struct {
	UUID            string
	Index           int
	GPUInstance     int
	ComputeInstance int
}

// Snapshot is one sampling cycle over every target.
type Snapshot struct {
	// Seq counts cycles from 1.
	Seq  uint64
	Time time.Time
	// LibErr is set when the library itself failed this cycle (the
	// device count could not be read, or the read timed out): every
	// Sample is then Absent with the same error.
	LibErr error
	// Samples are in target order.
	Samples []Sample
}

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Interval between cycles; DefaultSampleInterval when zero.
	Interval time.Duration
}

// Sampler reads every target GPU once per interval (each GPU on its own
// lane, so a hung GPU delays nobody) and publishes the cycle as an
// immutable Snapshot. Health checks and metrics both consume snapshots;
// neither calls NVML for readings.
type Sampler struct {
	o   *Owner
	cfg SamplerConfig

	targets atomic.Pointer[[]Target]
	latest  atomic.Pointer[Snapshot]
	kick    chan struct{}
	// layout is signalled when a cycle found the MIG layout changed.
	layout chan struct{}
	seq    uint64
	count  int // the device count of the last cycle
	cycle  sync.Mutex

	subsMu sync.Mutex
	subs   []chan struct{}
	queues []chan *Snapshot

	// links is, per GPU, one past the highest NVLink that exists (learnt
	// from its first complete sample), so later cycles ask NVML only
	// about links the GPU has: an H100 has 18 of NVLINK_MAX_LINKS.
	linksMu sync.Mutex
	links   map[string]int

	// lastSeen is, per GPU, the newest process utilisation sample
	// timestamp read (nvmlDeviceGetProcessUtilization's lastSeenTimeStamp
	// for the next read).
	lastSeenMu sync.Mutex
	lastSeen   map[string]uint64
}

// NewSampler returns a sampler over o. Call SetTargets, then Run.
func NewSampler(o *Owner, cfg SamplerConfig) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultSampleInterval
	}
	return &Sampler{o: o, cfg: cfg, kick: make(chan struct{}, 1), layout: make(chan struct{}, 1), links: map[string]int{},
		lastSeen: map[string]uint64{}}
}

// Interval is the sampling period.
func (s *Sampler) Interval() time.Duration { return s.cfg.Interval }

// SetTargets sets the GPUs to sample (after every discovery) and, when
// they changed, asks Run for a fresh cycle. It never waits for a cycle in
// progress.
func (s *Sampler) SetTargets(t []Target) {
	old := s.targets.Swap(&t)
	if old != nil && slices.EqualFunc(*old, t, func(a, b Target) bool { return a.UUID == b.UUID && slices.Equal(a.MIG, b.MIG) }) {
		// An unchanged rescan: the next cycle comes on the interval.
		return
	}
	uuids := make([]string, len(t))
	for i, g := range t {
		uuids[i] = g.UUID
	}
	s.lastSeenMu.Lock()
	for uuid := range s.lastSeen {
		if !slices.Contains(uuids, uuid) {
			delete(s.lastSeen, uuid)
		}
	}
	s.lastSeenMu.Unlock()
	s.o.SetGPUs(uuids)
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// LayoutChanged is signalled (coalesced) when a cycle found a MIG handle
// index holding another MIG device than discovery saw: the layout changed
// on a node that gives no change signal, and wants a rediscovery.
func (s *Sampler) LayoutChanged() <-chan struct{} { return s.layout }

// Kick asks Run for a cycle now rather than at the next tick (coalesced;
// never blocks).
func (s *Sampler) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Subscribe returns a channel signalled (coalesced, never blocking the
// sampler) after every cycle; read Latest then.
func (s *Sampler) Subscribe() <-chan struct{} {
	ch := make(chan struct{}, 1)
	s.subsMu.Lock()
	s.subs = append(s.subs, ch)
	s.subsMu.Unlock()
	return ch
}

// Snapshots returns a channel that receives every cycle's snapshot in
// order, for a consumer that must see each one (the health checks compare
// consecutive samples: a reset shows only as a change between two). It
// holds n; a consumer that falls n behind loses the oldest.
func (s *Sampler) Snapshots(n int) <-chan *Snapshot {
	q := make(chan *Snapshot, max(n, 1))
	s.subsMu.Lock()
	s.queues = append(s.queues, q)
	s.subsMu.Unlock()
	return q
}

// Latest is the last complete cycle, nil before the first.
func (s *Sampler) Latest() *Snapshot { return s.latest.Load() }

// Run samples at once, then every interval and after every SetTargets,
// until ctx ends.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		if s.targets.Load() != nil {
			s.SampleNow(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.kick:
		}
	}
}

// SampleNow runs one cycle, publishes it and returns it (nil when ctx
// ended during the cycle). Run calls it; tests call it for a deterministic
// number of cycles.
func (s *Sampler) SampleNow(ctx context.Context) *Snapshot {
	s.cycle.Lock()
	defer s.cycle.Unlock()
	var targets []Target
	if p := s.targets.Load(); p != nil {
		targets = *p
	}
	snap := &Snapshot{Time: time.Now(), Samples: make([]Sample, len(targets))}
	for i, t := range targets {
		snap.Samples[i] = Sample{UUID: t.UUID, Time: snap.Time}
	}
	eventReasons := false
	if len(targets) > 0 {
		var count int
		snap.LibErr = s.o.Lib(ctx, "device count", func(lib Library) nvml.Return {
			var ret nvml.Return
			count, ret = lib.DeviceGetCount()
			return ret
		})
		if snap.LibErr == nil {
			eventReasons = s.o.hasEventReasons(ctx)
		}
		if snap.LibErr == nil && count != s.count {
			// GPUs appeared or vanished (a driver reload, a GPU that
			// failed to initialise): handles may be stale, look them
			// up again by UUID.
			s.o.dropHandles()
			s.count = count
		}
	}
	if snap.LibErr != nil {
		for i := range snap.Samples {
			snap.Samples[i].Err = snap.LibErr
		}
	} else {
		var wg sync.WaitGroup
		for i := range targets {
			wg.Go(func() { s.sampleGPU(ctx, targets[i], eventReasons, &snap.Samples[i]) })
		}
		wg.Wait()
	}
	if ctx.Err() != nil {
		return nil
	}
	for i := range snap.Samples {
		if snap.Samples[i].MIGChanged {
			select {
			case s.layout <- struct{}{}:
			default:
			}
			break
		}
	}
	s.seq++
	snap.Seq = s.seq
	s.latest.Store(snap)
	s.subsMu.Lock()
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	for _, q := range s.queues {
		for sent := false; !sent; {
			select {
			case q <- snap:
				sent = true
			default:
				// The consumer is a whole buffer behind: drop its
				// oldest snapshot rather than wait for it.
				select {
				case <-q:
				default:
				}
			}
		}
	}
	s.subsMu.Unlock()
	return snap
}

// sampleGPU reads one GPU on its lane into out. The read fills a sample of
// its own; out is written only if the read finished in time, so a late
// reader never races with the consumer.
func (s *Sampler) sampleGPU(ctx context.Context, t Target, eventReasons bool, out *Sample) {
	var (
		mu   sync.Mutex
		done *Sample
	)
	err := s.o.Do(ctx, t.UUID, "sample", func(dev Device) nvml.Return {
		r := &Sample{UUID: t.UUID, Time: out.Time}
		seen := s.utilSeen(t.UUID)
		ret := readSample(dev, t, r, s.linkBound(t.UUID), &seen, eventReasons)
		if ret == nvml.SUCCESS {
			s.learnLinks(t.UUID, r.Links)
		}
		s.setUtilSeen(t.UUID, seen)
		mu.Lock()
		done = r
		mu.Unlock()
		return ret
	})
	mu.Lock()
	defer mu.Unlock()
	if err != nil && (done == nil || errors.Is(err, ErrTimeout)) {
		out.Err = err
		return
	}
	*out = *done
	if err != nil {
		out.Err = err
		out.Values = [NumFields]Value{}
		out.Links, out.MIG = nil, nil
		out.Processes, out.ProcessesRead, out.ProcessUtilRead = nil, Value{}, Value{}
	}
}

// readSample reads every field of one GPU. It returns non-SUCCESS only
// when the GPU as a whole is gone (GPU_IS_LOST), which makes the sample's
// Err; a field that fails otherwise fails alone. utilSeen is the GPU's
// process utilisation lastSeenTimeStamp, updated by the read; eventReasons
// says the driver has nvmlDeviceGetCurrentClocksEventReasons.
func readSample(dev Device, t Target, r *Sample, links int, utilSeen *uint64, eventReasons bool) nvml.Return {
	v := &r.Values
	lost := false
	note := func(ret nvml.Return) nvml.Return {
		if ret == nvml.ERROR_GPU_IS_LOST {
			lost = true
		}
		return ret
	}
	if u, ret := dev.GetUtilizationRates(); note(ret) == nvml.SUCCESS {
		v[FieldGPUUtil], v[FieldMemCopyUtil] = valueOf(uint64(u.Gpu), ret), valueOf(uint64(u.Memory), ret)
	} else {
		v[FieldGPUUtil], v[FieldMemCopyUtil] = valueOf(0, ret), valueOf(0, ret)
	}
	m, ret := dev.GetMemoryInfo()
	note(ret)
	v[FieldFBUsed], v[FieldFBFree], v[FieldFBTotal] = valueOf(m.Used, ret), valueOf(m.Free, ret), valueOf(m.Total, ret)
	u32 := func(f Field, val uint32, ret nvml.Return) { v[f] = valueOf(uint64(val), note(ret)) }
	m2, ret := dev.GetMemoryInfo_v2()
	v[FieldFBReserved] = valueOf(m2.Reserved, note(ret))
	enc, _, ret := dev.GetEncoderUtilization()
	u32(FieldEncUtil, enc, ret)
	dec, _, ret := dev.GetDecoderUtilization()
	u32(FieldDecUtil, dec, ret)
	lic, ret := dev.GetGridLicensableFeatures()
	v[FieldVGPULicense] = valueOf(boolValue(licensed(lic)), note(ret))
	c, ret := dev.GetClockInfo(nvml.CLOCK_SM)
	u32(FieldSMClock, c, ret)
	c, ret = dev.GetClockInfo(nvml.CLOCK_MEM)
	u32(FieldMemClock, c, ret)
	c, ret = dev.GetTemperature(nvml.TEMPERATURE_GPU)
	u32(FieldGPUTemp, c, ret)
	c, ret = dev.GetPowerUsage()
	u32(FieldPowerUsage, c, ret)
	e, ret := dev.GetTotalEnergyConsumption()
	v[FieldTotalEnergy] = valueOf(e, note(ret))
	n, ret := dev.GetPcieReplayCounter()
	v[FieldPCIeReplay] = valueOf(uint64(n), note(ret))
	// nvml.h nvmlDeviceGetCurrentClocksEventReasons: "bitmask of active
	// clocks event reasons" (nvmlClocksEventReason*), NOT_SUPPORTED where
	// the device has none; the deprecated call answers the same bits.
	var mask uint64
	if eventReasons {
		mask, ret = dev.GetCurrentClocksEventReasons()
	} else {
		mask, ret = dev.GetCurrentClocksThrottleReasons()
	}
	v[FieldClocksEventReasons] = valueOf(mask, note(ret))
	readFieldValues(dev, v, note)

	if cur, _, ret := dev.GetEccMode(); note(ret) == nvml.SUCCESS {
		v[FieldECCMode] = valueOf(boolValue(cur == nvml.FEATURE_ENABLED), ret)
	} else {
		v[FieldECCMode] = valueOf(0, ret)
	}
	for _, k := range []struct {
		f       Field
		typ     nvml.MemoryErrorType
		counter nvml.EccCounterType
	}{
		{FieldECCSBEVolatile, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC},
		{FieldECCDBEVolatile, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC},
		{FieldECCSBEAggregate, nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC},
		{FieldECCDBEAggregate, nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC},
	} {
		cnt, ret := dev.GetTotalEccErrors(k.typ, k.counter)
		v[k.f] = valueOf(cnt, note(ret))
	}
	for _, p := range []struct {
		f     Field
		cause nvml.PageRetirementCause
	}{
		{FieldRetiredSBE, nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS},
		{FieldRetiredDBE, nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR},
	} {
		pages, ret := dev.GetRetiredPages(p.cause)
		v[p.f] = valueOf(uint64(len(pages)), note(ret))
	}
	st, ret := dev.GetRetiredPagesPendingStatus()
	v[FieldRetiredPending] = valueOf(boolValue(st == nvml.FEATURE_ENABLED), note(ret))
	corr, unc, pending, failed, ret := dev.GetRemappedRows()
	note(ret)
	v[FieldRemapCorrectable], v[FieldRemapUncorrectable] = valueOf(uint64(corr), ret), valueOf(uint64(unc), ret)
	v[FieldRemapPending], v[FieldRemapFailure] = valueOf(boolValue(pending), ret), valueOf(boolValue(failed), ret)
	// The v1 call: go-nvml's GetGpuFabricInfoV returns a handler around
	// the real C handle, which a simulated library cannot answer.
	fi, ret := dev.GetGpuFabricInfo()
	v[FieldFabricState], v[FieldFabricStatus] = valueOf(uint64(fi.State), note(ret)), valueOf(uint64(fi.Status), ret)

	r.Links = readLinks(dev, note, links)
	var migs map[string]Device
	for _, mt := range t.MIG {
		ms := MIGSample{UUID: mt.UUID}
		mig, ret := dev.GetMigDeviceHandleByIndex(mt.Index)
		var uuid string
		if note(ret) == nvml.SUCCESS {
			uuid, ret = mig.GetUUID()
		}
		switch {
		case ret != nvml.SUCCESS:
			ms.FBUsed, ms.FBFree = valueOf(0, ret), valueOf(0, ret)
		case uuid != mt.UUID:
			// The MIG layout changed since the last discovery (a real
			// node has no change signal): the index now holds another
			// device, whose readings must not carry this UUID.
			stale := Value{Status: Failed, Err: fmt.Errorf("mig index %d is now %s", mt.Index, uuid)}
			ms.FBUsed, ms.FBFree = stale, stale
			r.MIGChanged = true
		default:
			mm, ret := mig.GetMemoryInfo()
			ms.FBUsed, ms.FBFree = valueOf(mm.Used, note(ret)), valueOf(mm.Free, ret)
			if migs == nil {
				migs = map[string]Device{}
			}
			migs[mt.UUID] = mig
		}
		r.MIG = append(r.MIG, ms)
	}
	readProcesses(dev, t, r, note)
	if !r.MIGChanged {
		readMIGProcessMemory(migs, r, note)
	}
	*utilSeen = readProcessUtil(dev, r, *utilSeen, note)
	if lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

// licensed says whether vGPU software licensing is supported and one of
// the licensable features is licensed (nvml.h nvmlGridLicensableFeature_t
// featureState: "Non-zero if feature is currently licensed"); a GPU
// without vGPU licensing reads 0, as dcgm-exporter's
// DCGM_FI_DEV_VGPU_LICENSE_STATUS does on bare metal.
func licensed(f nvml.GridLicensableFeatures) bool {
	if f.IsGridLicenseSupported == 0 {
		return false
	}
	for i := range min(int(f.LicensableFeaturesCount), len(f.GridLicensableFeatures)) {
		if f.GridLicensableFeatures[i].FeatureState != 0 {
			return true
		}
	}
	return false
}

// readFieldValues reads, in one call, what NVML exposes only as field
// values. Each field carries its own return code.
func readFieldValues(dev Device, v *[NumFields]Value, note func(nvml.Return) nvml.Return) {
	fvs := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_MEMORY_TEMP},
		{FieldId: nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL},
		{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION},
	}
	targets := []Field{FieldMemTemp, FieldNVLinkBandwidth, FieldRecoveryAction}
	if ret := note(dev.GetFieldValues(fvs)); ret != nvml.SUCCESS {
		for _, f := range targets {
			v[f] = valueOf(0, ret)
		}
		return
	}
	for i, fv := range fvs {
		ret := nvml.Return(fv.NvmlReturn)
		if ret != nvml.SUCCESS {
			v[targets[i]] = valueOf(0, ret)
			continue
		}
		x, ok := fieldUint(fv)
		if !ok {
			v[targets[i]] = Value{Status: Failed, Err: fmt.Errorf("field %d: value type %d", fv.FieldId, fv.ValueType)}
			continue
		}
		v[targets[i]] = Value{V: x, Status: OK}
	}
}

// readLinks reads the NVLinks below max that exist: state and the four DL
// error counters, each on its own (one unsupported counter drops only
// itself).
func readLinks(dev Device, note func(nvml.Return) nvml.Return, max int) []Link {
	var links []Link
	for l := range max {
		state, ret := dev.GetNvLinkState(l)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_FUNCTION_NOT_FOUND {
			if l == 0 && ret != nvml.ERROR_INVALID_ARGUMENT {
				// No NVLink on this GPU.
				return nil
			}
			continue
		}
		lk := Link{Link: l, Up: valueOf(boolValue(state == nvml.FEATURE_ENABLED), note(ret))}
		if ret == nvml.SUCCESS && state == nvml.FEATURE_ENABLED {
			for i, c := range NVLinkCounters {
				n, ret := dev.GetNvLinkErrorCounter(l, c)
				lk.Counters[i] = valueOf(n, note(ret))
			}
		}
		links = append(links, lk)
	}
	readRecoveries(dev, links, note)
	return links
}

// readRecoveries reads, in one field-values call, the NVLink5 recovery
// event count and the NVLink5 error and FEC counters (Link.NVLink5) of
// every up link whose DL error counters the GPU does not support
// (Blackwell and later).
func readRecoveries(dev Device, links []Link, note func(nvml.Return) nvml.Return) {
	var fvs []nvml.FieldValue
	// dst is where each field value's reading goes.
	var dst []*Value
	for i := range links {
		l := &links[i]
		if l.Up.V != 1 || l.Up.Status != OK || l.Counters[0].Status != NotSupported {
			continue
		}
		fvs = append(fvs, nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, ScopeId: uint32(l.Link)})
		dst = append(dst, &l.Recoveries)
		for f := range NumNVLink5 {
			fvs = append(fvs, nvml.FieldValue{FieldId: NVLink5FieldID(f), ScopeId: uint32(l.Link)})
			dst = append(dst, &l.NVLink5[f])
		}
	}
	if len(fvs) == 0 {
		return
	}
	if ret := note(dev.GetFieldValues(fvs)); ret != nvml.SUCCESS {
		for _, v := range dst {
			*v = valueOf(0, ret)
		}
		return
	}
	for k, fv := range fvs {
		ret := nvml.Return(fv.NvmlReturn)
		if ret != nvml.SUCCESS {
			*dst[k] = valueOf(0, ret)
			continue
		}
		if x, ok := fieldUint(fv); ok {
			*dst[k] = Value{V: x, Status: OK}
		}
	}
}

// utilSeen is GPU uuid's process utilisation lastSeenTimeStamp (0 before
// its first sample).
func (s *Sampler) utilSeen(uuid string) uint64 {
	s.lastSeenMu.Lock()
	defer s.lastSeenMu.Unlock()
	return s.lastSeen[uuid]
}

// setUtilSeen records GPU uuid's process utilisation lastSeenTimeStamp,
// unless the GPU is no longer a target.
func (s *Sampler) setUtilSeen(uuid string, seen uint64) {
	if seen == 0 {
		return
	}
	targeted := false
	if p := s.targets.Load(); p != nil {
		targeted = slices.ContainsFunc(*p, func(t Target) bool { return t.UUID == uuid })
	}
	s.lastSeenMu.Lock()
	defer s.lastSeenMu.Unlock()
	if targeted {
		s.lastSeen[uuid] = seen
	}
}

// linkBound is how many link numbers to ask GPU uuid about.
func (s *Sampler) linkBound(uuid string) int {
	s.linksMu.Lock()
	defer s.linksMu.Unlock()
	if n, ok := s.links[uuid]; ok {
		return n
	}
	return nvml.NVLINK_MAX_LINKS
}

// learnLinks records how many link numbers GPU uuid has.
func (s *Sampler) learnLinks(uuid string, links []Link) {
	n := 0
	if len(links) > 0 {
		n = links[len(links)-1].Link + 1
	}
	s.linksMu.Lock()
	defer s.linksMu.Unlock()
	if _, ok := s.links[uuid]; !ok {
		s.links[uuid] = n
	}
}

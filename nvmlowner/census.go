package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Census is what every method of the agent's NVML (package nvmlapi:
// Library, Device, GpuInstance, ComputeInstance, EventSet) answered on one
// node, call by call: on every GPU and every MIG device, with the
// arguments the agent uses or that nvml.h defines. It is read-only: every
// call is a getter (the calls that make and destroy GPU and compute
// instances, CensusMutators, are never made), and the event sets it
// creates are its own and freed. Calls go through
// the owner's lanes, so each is bounded by the call timeout and a hung GPU
// costs its own calls one timeout and delays no other GPU.
type Census struct {
	// CallTimeout is the owner's bound on each call.
	CallTimeout string `json:"callTimeout"`
	// Elapsed is how long the census took.
	Elapsed string `json:"elapsed"`
	// DriverVersion, CUDADriverVersion and DeviceCount repeat the library
	// calls' answers (empty or zero when they failed).
	DriverVersion     string `json:"driverVersion,omitempty"`
	CUDADriverVersion int    `json:"cudaDriverVersion,omitempty"`
	DeviceCount       int    `json:"deviceCount"`
	// Library is the library-wide calls, in order: Init first and the
	// Shutdown that balances it last.
	Library []CensusCall `json:"library"`
	// Devices are the GPUs in NVML index order, each followed by its MIG
	// devices.
	Devices []CensusDevice `json:"devices"`
	// Events are the event sets the census created, one per event type
	// it registers and then the agent's own (EventTypes), which it waits
	// on once.
	Events []CensusEventSet `json:"events"`
}

// CensusDevice is one GPU or MIG device and every call made on it.
type CensusDevice struct {
	// Index is the GPU's NVML index, or the MIG device's index on its
	// parent (GetMigDeviceHandleByIndex).
	Index int `json:"index"`
	// Parent is a MIG device's GPU index; nil for a GPU.
	Parent *int   `json:"parent,omitempty"`
	UUID   string `json:"uuid,omitempty"`
	// GPUInstance and ComputeInstance are a MIG device's instance IDs
	// (GetGpuInstanceId, GetComputeInstanceId); nil for a GPU or when
	// the call failed.
	GPUInstance     *int         `json:"gpuInstance,omitempty"`
	ComputeInstance *int         `json:"computeInstance,omitempty"`
	Calls           []CensusCall `json:"calls"`
}

// CensusEventSet is one event set's life: created, registered on every
// GPU for EventTypes, (for the agent's set) waited on, freed.
type CensusEventSet struct {
	// EventTypes names the mask by nvml.h's event type names.
	EventTypes string       `json:"eventTypes"`
	Mask       uint64       `json:"mask"`
	Calls      []CensusCall `json:"calls"`
}

// CensusCall is one call: the method (GpuInstance and EventSet methods
// prefixed with their interface, "EventSet.Wait"), its arguments and what
// it answered.
type CensusCall struct {
	Method string `json:"method"`
	// Device is the GPU index of a call listed outside its device
	// (RegisterEvents, under Events).
	Device *int  `json:"device,omitempty"`
	Args   []any `json:"args,omitempty"`
	// Ret is the nvml.Return by nvml.h's name without "NVML_"
	// ("SUCCESS", "ERROR_NOT_SUPPORTED"), or one of CensusCallTimeout,
	// CensusNotCalled, CensusCancelled, CensusPanic; empty for a method
	// without a return (Extensions).
	Ret string `json:"ret,omitempty"`
	// Value is what the call returned, only when Ret is SUCCESS (NVML
	// leaves outputs undefined otherwise): a multi-value return as named
	// fields, nvml.h enums by name, structs with nvml.h's field names.
	Value any `json:"value,omitempty"`
	// Error says why a call has no NVML return.
	Error string `json:"error,omitempty"`
	// Micros is how long the call took, waiting for its lane included.
	Micros int64 `json:"micros,omitempty"`
}

// Census call outcomes that are not NVML returns.
const (
	// CensusCallTimeout: the call did not return within the owner's call
	// timeout (NVML's own timeout, from EventSet.Wait, is ERROR_TIMEOUT).
	CensusCallTimeout = "CALL_TIMEOUT"
	// CensusNotCalled: the call was not made: an earlier call on the
	// same GPU is still running past the timeout, the handle lookup
	// before it failed, the argument is unknown, or the driver lacks the
	// symbol (go-nvml would exit the process).
	CensusNotCalled = "NOT_CALLED"
	// CensusCancelled: the census's context ended first.
	CensusCancelled = "CANCELLED"
	// CensusPanic: the binding panicked (a simulator or mock gap).
	CensusPanic = "PANIC"
)

// CensusOptions configures a census.
type CensusOptions struct {
	// EventWait is the timeout of the one EventSet.Wait (DefaultCensusEventWait
	// when zero), capped at half the call timeout so the wait itself is
	// never taken for a hang.
	EventWait time.Duration
}

// CensusMutators are the nvmlapi methods a census never calls, as the
// census names them: they make and destroy MIG GPU and compute instances
// (MakeMIG, UnmakeMIG).
var CensusMutators = []string{
	"CreateGpuInstanceWithPlacement", "GpuInstance.CreateComputeInstance", "GpuInstance.Destroy", "ComputeInstance.Destroy",
}

// DefaultCensusEventWait is CensusOptions.EventWait's default.
const DefaultCensusEventWait = 100 * time.Millisecond

// optionalSymbols are the NVML symbols the agent looks up before calling
// them (Library.Extensions); see hasEventReasons.
var optionalSymbols = []string{eventReasonsSymbol}

// noReturn is what a census function returns for a method without an
// nvml.Return (Extensions).
const noReturn nvml.Return = -1

// Census calls every method of the agent's NVML on every GPU and MIG
// device and records the answers. It initialises NVML itself (Init is the
// first call recorded, balanced by the last, Shutdown) and fails only when
// that Init fails: every other failure, a timeout included, is data.
func (o *Owner) Census(ctx context.Context, opts CensusOptions) (*Census, error) {
	start := time.Now()
	if opts.EventWait <= 0 {
		opts.EventWait = DefaultCensusEventWait
	}
	opts.EventWait = min(opts.EventWait, o.cfg.CallTimeout/2)
	c := &Census{CallTimeout: o.cfg.CallTimeout.String(), Library: []CensusCall{}, Devices: []CensusDevice{}, Events: []CensusEventSet{}}
	lib := o.libCensusLane(ctx)
	libCall := func(method string, args []any, fn func(Library) (any, nvml.Return)) CensusCall {
		call := lib.call(method, args, func(Device) (any, nvml.Return) { return fn(o.lib) })
		c.Library = append(c.Library, call)
		return call
	}

	if call := libCall("Init", nil, func(l Library) (any, nvml.Return) { return nil, l.Init() }); !call.is(nvml.SUCCESS) {
		c.Elapsed = time.Since(start).String()
		if call.Error != "" {
			return c, fmt.Errorf("nvml init: %s: %s", call.Ret, call.Error)
		}
		return c, fmt.Errorf("nvml init: %s", call.Ret)
	}
	if call := libCall("SystemGetDriverVersion", nil, func(l Library) (any, nvml.Return) { return l.SystemGetDriverVersion() }); call.is(nvml.SUCCESS) {
		c.DriverVersion, _ = call.Value.(string)
	}
	if call := libCall("SystemGetCudaDriverVersion", nil, func(l Library) (any, nvml.Return) { return l.SystemGetCudaDriverVersion() }); call.is(nvml.SUCCESS) {
		c.CUDADriverVersion, _ = call.Value.(int)
	}
	if call := libCall("DeviceGetCount", nil, func(l Library) (any, nvml.Return) { return l.DeviceGetCount() }); call.is(nvml.SUCCESS) {
		if n, ok := call.Value.(int); ok && n > 0 {
			c.DeviceCount = n
		}
	}
	symbols := map[string]bool{}
	call := libCall("Extensions", nil, func(l Library) (any, nvml.Return) { return lookupSymbols(l) })
	if found, ok := call.Value.(map[string]any); ok {
		for name, v := range found {
			symbols[name] = v == true
		}
	}

	gpus := make([]*gpuCensus, c.DeviceCount)
	var wg sync.WaitGroup
	for i := range gpus {
		gpus[i] = &gpuCensus{o: o, ctx: ctx, index: i, symbols: symbols}
		wg.Go(gpus[i].identify)
	}
	wg.Wait()
	for _, g := range gpus {
		wg.Go(func() { g.run(gpus) })
	}
	wg.Wait()
	for _, g := range gpus {
		c.Devices = append(c.Devices, g.devices...)
	}

	c.Events = o.censusEvents(ctx, lib, gpus, opts.EventWait)
	libCall("Shutdown", nil, func(l Library) (any, nvml.Return) { return nil, l.Shutdown() })
	c.Elapsed = time.Since(start).String()
	return c, nil
}

// lookupSymbols is Extensions: which optional symbols the library has
// (true), or why not.
func lookupSymbols(l Library) (any, nvml.Return) {
	out := map[string]any{}
	ext := l.Extensions()
	for _, name := range optionalSymbols {
		if ext == nil {
			out[name] = "no extended interface"
			continue
		}
		if err := ext.LookupSymbol(name); err != nil {
			out[name] = err.Error()
			continue
		}
		out[name] = true
	}
	return out, noReturn
}

// censusLane makes census calls on one of the owner's lanes.
type censusLane struct {
	o   *Owner
	ctx context.Context
	// key is the lane's key in o.lanes; "" for the library lane.
	key string
	// lookup is the handle lookup run makes before each call
	// (DeviceGetHandleByIndex, DeviceGetHandleByUUID); "" for none.
	lookup string
	// run runs body on the lane (Lib, Do or DoIndex); dev is nil on
	// the library lane.
	run func(what string, body func(dev Device) nvml.Return) error
}

func (o *Owner) libCensusLane(ctx context.Context) *censusLane {
	return &censusLane{o: o, ctx: ctx, run: func(what string, body func(Device) nvml.Return) error {
		return o.Lib(ctx, what, func(Library) nvml.Return { return body(nil) })
	}}
}

func (o *Owner) indexCensusLane(ctx context.Context, i int) *censusLane {
	return &censusLane{o: o, ctx: ctx, key: indexLane(i), lookup: "DeviceGetHandleByIndex",
		run: func(what string, body func(Device) nvml.Return) error { return o.DoIndex(ctx, i, what, body) }}
}

func (o *Owner) gpuCensusLane(ctx context.Context, uuid string) *censusLane {
	return &censusLane{o: o, ctx: ctx, key: uuid, lookup: "DeviceGetHandleByUUID",
		run: func(what string, body func(Device) nvml.Return) error { return o.Do(ctx, uuid, what, body) }}
}

// overdue names the call that holds the lane past the call timeout, if
// one does: the census makes no further call there until it returns.
func (l *censusLane) overdue() (string, bool) {
	ln := l.o.libLane
	if l.key != "" {
		ln = l.o.lane(l.key)
	}
	if !ln.hung(l.o.cfg.CallTimeout) {
		return "", false
	}
	ln.mu.Lock()
	defer ln.mu.Unlock()
	return ln.what, true
}

// call makes one call on the lane and records it. fn runs on the lane
// (it may outlive the call timeout: nothing it returns is read then).
func (l *censusLane) call(method string, args []any, fn func(dev Device) (any, nvml.Return)) CensusCall {
	c := CensusCall{Method: method, Args: args}
	if err := l.ctx.Err(); err != nil {
		c.Ret, c.Error = CensusCancelled, err.Error()
		return c
	}
	if running, hung := l.overdue(); hung {
		c.Ret = CensusNotCalled
		c.Error = fmt.Sprintf("not called: an earlier call on this lane (%s) has run past the call timeout", running)
		return c
	}
	type result struct {
		v        any
		ret      nvml.Return
		panicked any
	}
	done := make(chan result, 1)
	start := time.Now()
	err := l.run("census "+method, func(dev Device) nvml.Return {
		var r result
		defer func() {
			if p := recover(); p != nil {
				r.panicked = p
			}
			done <- r
		}()
		r.v, r.ret = fn(dev)
		return nvml.SUCCESS
	})
	c.Micros = max(time.Since(start).Microseconds(), 1)
	var ret nvml.Return
	switch {
	case err == nil:
		r := <-done
		switch {
		case r.panicked != nil:
			c.Ret, c.Error = CensusPanic, fmt.Sprint(r.panicked)
		case r.ret == noReturn:
			c.Value = jsonValue(r.v)
		default:
			c.Ret = returnName(r.ret)
			if r.ret == nvml.SUCCESS {
				c.Value = jsonValue(r.v)
			}
		}
	case errors.Is(err, ErrTimeout):
		c.Ret, c.Error = CensusCallTimeout, err.Error()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		c.Ret, c.Error = CensusCancelled, err.Error()
	case errors.As(err, &ret) && method == l.lookup:
		// The lookup before the call is the call.
		c.Ret = returnName(ret)
	case errors.As(err, &ret):
		c.Ret, c.Error = CensusNotCalled, fmt.Sprintf("not called: %s answered %s", l.lookup, returnName(ret))
	default:
		c.Ret, c.Error = CensusNotCalled, err.Error()
	}
	return c
}

// is says whether the call answered r.
func (c CensusCall) is(r nvml.Return) bool { return c.Ret == returnName(r) }

// answered says whether NVML answered the call (not a timeout, a call not
// made, a cancellation or a panic): loops over arguments stop otherwise.
func (c CensusCall) answered() bool {
	switch c.Ret {
	case CensusCallTimeout, CensusNotCalled, CensusCancelled, CensusPanic:
		return false
	}
	return true
}

// gpuCensus is the census of one GPU and its MIG devices.
type gpuCensus struct {
	o       *Owner
	ctx     context.Context
	index   int
	symbols map[string]bool
	// handle and uuid are the GPU's, once identify found them.
	handle Device
	uuid   string
	// devices is the GPU, then its MIG devices.
	devices []CensusDevice
}

// identify looks the GPU up by index and reads its UUID, on the GPU's
// index lane (the UUID lane needs the UUID).
func (g *gpuCensus) identify() {
	g.devices = []CensusDevice{{Index: g.index, Calls: []CensusCall{}}}
	d := &g.devices[0]
	il := g.o.indexCensusLane(g.ctx, g.index)
	var h Device
	call := il.call("DeviceGetHandleByIndex", []any{g.index}, func(dev Device) (any, nvml.Return) {
		h = dev
		return nil, nvml.SUCCESS
	})
	d.Calls = append(d.Calls, call)
	if !call.is(nvml.SUCCESS) {
		return
	}
	g.handle = h
	call = il.call("GetUUID", nil, func(dev Device) (any, nvml.Return) { return dev.GetUUID() })
	d.Calls = append(d.Calls, call)
	if call.is(nvml.SUCCESS) {
		g.uuid, _ = call.Value.(string)
		d.UUID = g.uuid
	}
}

// run calls every Device method on the GPU and its MIG devices, on the
// GPU's lane. all is every GPU, for the calls that take another GPU.
func (g *gpuCensus) run(all []*gpuCensus) {
	if g.uuid == "" {
		return
	}
	lane := g.o.gpuCensusLane(g.ctx, g.uuid)
	whole := &deviceCensus{g: g, lane: lane, calls: g.devices[0].Calls}
	whole.call("DeviceGetHandleByUUID", []any{g.uuid}, func(Device) (any, nvml.Return) {
		h, ret := g.o.lib.DeviceGetHandleByUUID(g.uuid)
		return map[string]bool{"sameHandle": h == g.handle}, ret
	})
	migs := whole.every(all)
	var gis []int
	// cis are the compute instance IDs of each GPU instance's MIG
	// devices.
	cis := map[int][]int{}
	for _, m := range migs {
		md := &deviceCensus{g: g, lane: lane, mig: m.handle, calls: []CensusCall{}}
		dev := CensusDevice{Index: m.index, Parent: &g.index}
		if call := md.call("GetUUID", nil, func(d Device) (any, nvml.Return) { return d.GetUUID() }); call.is(nvml.SUCCESS) {
			dev.UUID, _ = call.Value.(string)
			md.call("DeviceGetHandleByUUID", []any{dev.UUID}, func(Device) (any, nvml.Return) {
				h, ret := g.o.lib.DeviceGetHandleByUUID(dev.UUID)
				return map[string]bool{"sameHandle": h == m.handle}, ret
			})
		}
		md.every(all)
		dev.GPUInstance, dev.ComputeInstance, dev.Calls = md.gi, md.ci, md.calls
		g.devices = append(g.devices, dev)
		if md.gi != nil && !slices.Contains(gis, *md.gi) {
			gis = append(gis, *md.gi)
		}
		if md.gi != nil && md.ci != nil {
			cis[*md.gi] = append(cis[*md.gi], *md.ci)
		}
	}
	// The GPU instances of the GPU's MIG devices, on the GPU, with their
	// compute instances.
	slices.Sort(gis)
	for _, gi := range gis {
		whole.gpuInstance(gi, cis[gi])
	}
	g.devices[0].Calls = whole.calls
}

// migHandle is a MIG device found by GetMigDeviceHandleByIndex.
type migHandle struct {
	index  int
	handle Device
}

// deviceCensus records the calls on one GPU or MIG device.
type deviceCensus struct {
	g    *gpuCensus
	lane *censusLane
	// mig is the MIG device's handle; nil for the GPU (the handle Do
	// passes).
	mig   Device
	calls []CensusCall
	// gi and ci are the device's GPU and compute instance IDs, when
	// GetGpuInstanceId / GetComputeInstanceId answered.
	gi, ci *int
}

// call makes one call on the device and records it.
func (d *deviceCensus) call(method string, args []any, fn func(Device) (any, nvml.Return)) CensusCall {
	c := d.lane.call(method, args, func(dev Device) (any, nvml.Return) {
		if d.mig != nil {
			dev = d.mig
		}
		return fn(dev)
	})
	d.calls = append(d.calls, c)
	return c
}

// notCalled records a call the census cannot make, and why.
func (d *deviceCensus) notCalled(method string, args []any, why string) {
	d.calls = append(d.calls, CensusCall{Method: method, Args: args, Ret: CensusNotCalled, Error: "not called: " + why})
}

// every calls each Device method (but GetUUID, RegisterEvents and, on a
// GPU, GetGpuInstanceById, which the census calls where it has their
// arguments) and returns the MIG devices GetMigDeviceHandleByIndex found.
func (d *deviceCensus) every(all []*gpuCensus) []migHandle {
	d.identity()
	migs := d.migCalls()
	d.topology(all)
	d.nvLinks()
	d.pcie()
	d.readings()
	d.ecc()
	d.processes()
	return migs
}

func (d *deviceCensus) identity() {
	d.call("GetName", nil, func(dev Device) (any, nvml.Return) { return dev.GetName() })
	d.call("GetBrand", nil, func(dev Device) (any, nvml.Return) { return dev.GetBrand() })
	d.call("GetPciInfo", nil, func(dev Device) (any, nvml.Return) { return dev.GetPciInfo() })
	d.call("GetMinorNumber", nil, func(dev Device) (any, nvml.Return) { return dev.GetMinorNumber() })
	d.call("GetMemoryInfo", nil, func(dev Device) (any, nvml.Return) { return dev.GetMemoryInfo() })
	d.call("GetMemoryInfo_v2", nil, func(dev Device) (any, nvml.Return) { return dev.GetMemoryInfo_v2() })
	d.call("GetCudaComputeCapability", nil, func(dev Device) (any, nvml.Return) {
		major, minor, ret := dev.GetCudaComputeCapability()
		return map[string]int{"major": major, "minor": minor}, ret
	})
	d.call("GetAttributes", nil, func(dev Device) (any, nvml.Return) { return dev.GetAttributes() })
}

// migCalls makes the MIG calls: mode, instance IDs, the MIG device
// handles (0..GetMaxMigDeviceCount-1, or index 0 alone when that count
// is unknown or zero, to record the answer), the GPU instance profiles
// (nvml.h: NVML_GPU_INSTANCE_PROFILE_* from 0 to
// NVML_GPU_INSTANCE_PROFILE_COUNT-1), for each profile answered its
// placements and GPU instances, and, on a MIG device, its own GPU
// instance.
func (d *deviceCensus) migCalls() []migHandle {
	d.call("GetMigMode", nil, func(dev Device) (any, nvml.Return) {
		current, pending, ret := dev.GetMigMode()
		return map[string]int{"currentMode": current, "pendingMode": pending}, ret
	})
	if c := d.call("GetGpuInstanceId", nil, func(dev Device) (any, nvml.Return) { return dev.GetGpuInstanceId() }); c.is(nvml.SUCCESS) {
		d.gi = intPtr(c.Value)
	}
	if c := d.call("GetComputeInstanceId", nil, func(dev Device) (any, nvml.Return) { return dev.GetComputeInstanceId() }); c.is(nvml.SUCCESS) {
		d.ci = intPtr(c.Value)
	}
	n := 0
	if c := d.call("GetMaxMigDeviceCount", nil, func(dev Device) (any, nvml.Return) { return dev.GetMaxMigDeviceCount() }); c.is(nvml.SUCCESS) {
		n, _ = c.Value.(int)
	}
	var migs []migHandle
	for i := range max(n, 1) {
		var h Device
		c := d.call("GetMigDeviceHandleByIndex", []any{i}, func(dev Device) (any, nvml.Return) {
			m, ret := dev.GetMigDeviceHandleByIndex(i)
			h = m
			return nil, ret
		})
		if c.is(nvml.SUCCESS) && h != nil && d.mig == nil {
			migs = append(migs, migHandle{index: i, handle: h})
		}
		if !c.answered() {
			break
		}
	}
	for p := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		var info nvml.GpuInstanceProfileInfo
		c := d.call("GetGpuInstanceProfileInfo", []any{gpuInstanceProfileName(p)}, func(dev Device) (any, nvml.Return) {
			i, ret := dev.GetGpuInstanceProfileInfo(p)
			info = i
			return i, ret
		})
		if !c.answered() {
			break
		}
		if c.is(nvml.SUCCESS) && !d.gpuInstanceProfile(p, info) {
			break
		}
	}
	if d.mig != nil && d.gi != nil {
		d.gpuInstance(*d.gi, nil)
	}
	return migs
}

// gpuInstanceProfile calls GetGpuInstancePossiblePlacements and
// GetGpuInstances for GPU instance profile p (info, as
// GetGpuInstanceProfileInfo answered it); GetGpuInstances only for a
// profile that allows an instance (go-nvml sizes its buffer by the
// instance count). It says whether NVML answered.
func (d *deviceCensus) gpuInstanceProfile(p int, info nvml.GpuInstanceProfileInfo) bool {
	args := []any{gpuInstanceProfileName(p)}
	c := d.call("GetGpuInstancePossiblePlacements", args, func(dev Device) (any, nvml.Return) {
		own := info
		pls, ret := dev.GetGpuInstancePossiblePlacements(&own)
		return nonNil(pls), ret
	})
	if !c.answered() {
		return false
	}
	if info.InstanceCount == 0 {
		return true
	}
	c = d.call("GetGpuInstances", args, func(dev Device) (any, nvml.Return) {
		own := info
		gis, ret := dev.GetGpuInstances(&own)
		return map[string]int{"count": len(gis)}, ret
	})
	return c.answered()
}

// gpuInstance calls GetGpuInstanceById(id) and, if it answers, the GPU
// instance's GetInfo, its compute instance profiles
// (NVML_COMPUTE_INSTANCE_PROFILE_* from 0 to
// NVML_COMPUTE_INSTANCE_PROFILE_COUNT-1, shared engines, the one engine
// profile nvml.h defines) and its compute instances cis with their info.
func (d *deviceCensus) gpuInstance(id int, cis []int) {
	var gi GpuInstance
	c := d.call("GetGpuInstanceById", []any{id}, func(dev Device) (any, nvml.Return) {
		h, ret := dev.GetGpuInstanceById(id)
		gi = h
		return nil, ret
	})
	if !c.is(nvml.SUCCESS) || gi == nil {
		return
	}
	if c := d.call("GpuInstance.GetInfo", nil, func(Device) (any, nvml.Return) { return gi.GetInfo() }); !c.answered() {
		return
	}
	for p := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		c := d.call("GpuInstance.GetComputeInstanceProfileInfo", []any{computeInstanceProfileName(p), "COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"},
			func(Device) (any, nvml.Return) {
				return gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
			})
		if !c.answered() {
			return
		}
	}
	for _, id := range cis {
		var ci ComputeInstance
		c := d.call("GpuInstance.GetComputeInstanceById", []any{id}, func(Device) (any, nvml.Return) {
			h, ret := gi.GetComputeInstanceById(id)
			ci = h
			return nil, ret
		})
		if !c.answered() {
			return
		}
		if !c.is(nvml.SUCCESS) || ci == nil {
			continue
		}
		d.call("ComputeInstance.GetInfo", nil, func(Device) (any, nvml.Return) { return ci.GetInfo() })
	}
}

// topology calls GetTopologyCommonAncestor with every other GPU (on a MIG
// device, every GPU but its parent).
func (d *deviceCensus) topology(all []*gpuCensus) {
	for _, other := range all {
		if other == d.g {
			continue
		}
		args := []any{map[string]int{"gpu": other.index}}
		if other.handle == nil {
			d.notCalled("GetTopologyCommonAncestor", args, fmt.Sprintf("GPU %d has no handle", other.index))
			continue
		}
		c := d.call("GetTopologyCommonAncestor", args, func(dev Device) (any, nvml.Return) {
			return dev.GetTopologyCommonAncestor(other.handle)
		})
		if !c.answered() {
			break
		}
	}
}

// nvLinkErrorCounters are nvml.h's nvmlNvLinkErrorCounter_t values below
// NVML_NVLINK_ERROR_COUNT.
var nvLinkErrorCounters = []struct {
	name string
	c    nvml.NvLinkErrorCounter
}{
	{"NVLINK_ERROR_DL_REPLAY", nvml.NVLINK_ERROR_DL_REPLAY},
	{"NVLINK_ERROR_DL_RECOVERY", nvml.NVLINK_ERROR_DL_RECOVERY},
	{"NVLINK_ERROR_DL_CRC_FLIT", nvml.NVLINK_ERROR_DL_CRC_FLIT},
	{"NVLINK_ERROR_DL_CRC_DATA", nvml.NVLINK_ERROR_DL_CRC_DATA},
	{"NVLINK_ERROR_DL_ECC_DATA", nvml.NVLINK_ERROR_DL_ECC_DATA},
}

// nvLinks asks about links 0..NVML_NVLINK_MAX_LINKS-1 (nvml.h), each
// method stopping after the first INVALID_ARGUMENT (nvml.h: "link is
// invalid", a link past the GPU's last), then reads the error counters and
// the recovery event field of the links whose state call succeeded.
func (d *deviceCensus) nvLinks() {
	var links []int
	for l := range nvml.NVLINK_MAX_LINKS {
		c := d.call("GetNvLinkState", []any{l}, func(dev Device) (any, nvml.Return) { return dev.GetNvLinkState(l) })
		if c.is(nvml.SUCCESS) {
			links = append(links, l)
		}
		if c.is(nvml.ERROR_INVALID_ARGUMENT) || !c.answered() {
			break
		}
	}
	for l := range nvml.NVLINK_MAX_LINKS {
		c := d.call("GetNvLinkRemoteDeviceType", []any{l}, func(dev Device) (any, nvml.Return) { return dev.GetNvLinkRemoteDeviceType(l) })
		if c.is(nvml.ERROR_INVALID_ARGUMENT) || !c.answered() {
			break
		}
	}
	for l := range nvml.NVLINK_MAX_LINKS {
		c := d.call("GetNvLinkRemotePciInfo", []any{l}, func(dev Device) (any, nvml.Return) { return dev.GetNvLinkRemotePciInfo(l) })
		if c.is(nvml.ERROR_INVALID_ARGUMENT) || !c.answered() {
			break
		}
	}
links:
	for _, l := range links {
		for _, ec := range nvLinkErrorCounters {
			c := d.call("GetNvLinkErrorCounter", []any{l, ec.name}, func(dev Device) (any, nvml.Return) {
				return dev.GetNvLinkErrorCounter(l, ec.c)
			})
			if !c.answered() {
				break links
			}
		}
	}
	// The agent's per-link field (sampler.go, readRecoveries), scoped by
	// link (nvml.h: "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_*", scope =
	// link).
	if len(links) > 0 {
		fvs := make([]nvml.FieldValue, len(links))
		for i, l := range links {
			fvs[i] = nvml.FieldValue{FieldId: nvml.FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS, ScopeId: uint32(l)}
		}
		d.fieldValues(fvs)
	}
}

// fieldValues makes one GetFieldValues call with fvs (copied: the call
// may outlive the census's wait for it).
func (d *deviceCensus) fieldValues(fvs []nvml.FieldValue) {
	d.call("GetFieldValues", fieldArgs(fvs), func(dev Device) (any, nvml.Return) {
		own := slices.Clone(fvs)
		ret := dev.GetFieldValues(own)
		return fieldValuesJSON(own), ret
	})
}

func (d *deviceCensus) pcie() {
	d.call("GetCurrPcieLinkGeneration", nil, func(dev Device) (any, nvml.Return) { return dev.GetCurrPcieLinkGeneration() })
	d.call("GetCurrPcieLinkWidth", nil, func(dev Device) (any, nvml.Return) { return dev.GetCurrPcieLinkWidth() })
	d.call("GetMaxPcieLinkGeneration", nil, func(dev Device) (any, nvml.Return) { return dev.GetMaxPcieLinkGeneration() })
	d.call("GetMaxPcieLinkWidth", nil, func(dev Device) (any, nvml.Return) { return dev.GetMaxPcieLinkWidth() })
	d.call("GetPcieReplayCounter", nil, func(dev Device) (any, nvml.Return) { return dev.GetPcieReplayCounter() })
	d.call("GetPersistenceMode", nil, func(dev Device) (any, nvml.Return) { return dev.GetPersistenceMode() })
	// go-nvml exits the process on a symbol the driver lacks: called only
	// where the library has it, as the agent does (hasEventReasons).
	if d.g.symbols[eventReasonsSymbol] {
		d.call("GetCurrentClocksEventReasons", nil, func(dev Device) (any, nvml.Return) { return dev.GetCurrentClocksEventReasons() })
	} else {
		d.notCalled("GetCurrentClocksEventReasons", nil, "the library lacks "+eventReasonsSymbol+" (Extensions)")
	}
	d.call("GetCurrentClocksThrottleReasons", nil, func(dev Device) (any, nvml.Return) { return dev.GetCurrentClocksThrottleReasons() })
}

// clockTypes are nvml.h's nvmlClockType_t values below NVML_CLOCK_COUNT.
var clockTypes = []struct {
	name string
	t    nvml.ClockType
}{
	{"CLOCK_GRAPHICS", nvml.CLOCK_GRAPHICS},
	{"CLOCK_SM", nvml.CLOCK_SM},
	{"CLOCK_MEM", nvml.CLOCK_MEM},
	{"CLOCK_VIDEO", nvml.CLOCK_VIDEO},
}

func (d *deviceCensus) readings() {
	d.call("GetUtilizationRates", nil, func(dev Device) (any, nvml.Return) { return dev.GetUtilizationRates() })
	for _, ct := range clockTypes {
		if c := d.call("GetClockInfo", []any{ct.name}, func(dev Device) (any, nvml.Return) { return dev.GetClockInfo(ct.t) }); !c.answered() {
			break
		}
	}
	// nvml.h nvmlTemperatureSensors_t: NVML_TEMPERATURE_GPU is its one
	// value below NVML_TEMPERATURE_COUNT.
	d.call("GetTemperature", []any{"TEMPERATURE_GPU"}, func(dev Device) (any, nvml.Return) { return dev.GetTemperature(nvml.TEMPERATURE_GPU) })
	d.call("GetPowerUsage", nil, func(dev Device) (any, nvml.Return) { return dev.GetPowerUsage() })
	d.call("GetTotalEnergyConsumption", nil, func(dev Device) (any, nvml.Return) { return dev.GetTotalEnergyConsumption() })
	d.call("GetEncoderUtilization", nil, func(dev Device) (any, nvml.Return) {
		u, period, ret := dev.GetEncoderUtilization()
		return map[string]uint32{"utilization": u, "samplingPeriodUs": period}, ret
	})
	d.call("GetDecoderUtilization", nil, func(dev Device) (any, nvml.Return) {
		u, period, ret := dev.GetDecoderUtilization()
		return map[string]uint32{"utilization": u, "samplingPeriodUs": period}, ret
	})
	// The fields the agent reads in one call (sampler.go, readFieldValues).
	d.fieldValues([]nvml.FieldValue{
		{FieldId: nvml.FI_DEV_MEMORY_TEMP},
		{FieldId: nvml.FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL},
		{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION},
	})
	d.call("GetGpuFabricInfo", nil, func(dev Device) (any, nvml.Return) { return dev.GetGpuFabricInfo() })
	d.call("GetGridLicensableFeatures", nil, func(dev Device) (any, nvml.Return) { return dev.GetGridLicensableFeatures() })
}

// ecc reads the ECC mode, the four ECC totals (nvml.h
// nvmlMemoryErrorType_t CORRECTED/UNCORRECTED x nvmlEccCounterType_t
// VOLATILE_ECC/AGGREGATE_ECC), the retired pages of both causes (nvml.h
// nvmlPageRetirementCause_t) and the row remapper.
func (d *deviceCensus) ecc() {
	d.call("GetEccMode", nil, func(dev Device) (any, nvml.Return) {
		current, pending, ret := dev.GetEccMode()
		return map[string]nvml.EnableState{"current": current, "pending": pending}, ret
	})
	for _, t := range []struct {
		name string
		t    nvml.MemoryErrorType
	}{{"MEMORY_ERROR_TYPE_CORRECTED", nvml.MEMORY_ERROR_TYPE_CORRECTED}, {"MEMORY_ERROR_TYPE_UNCORRECTED", nvml.MEMORY_ERROR_TYPE_UNCORRECTED}} {
		for _, ct := range []struct {
			name string
			c    nvml.EccCounterType
		}{{"VOLATILE_ECC", nvml.VOLATILE_ECC}, {"AGGREGATE_ECC", nvml.AGGREGATE_ECC}} {
			d.call("GetTotalEccErrors", []any{t.name, ct.name}, func(dev Device) (any, nvml.Return) { return dev.GetTotalEccErrors(t.t, ct.c) })
		}
	}
	for _, cause := range []struct {
		name string
		c    nvml.PageRetirementCause
	}{
		{"PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS},
		{"PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR},
	} {
		d.call("GetRetiredPages", []any{cause.name}, func(dev Device) (any, nvml.Return) {
			pages, ret := dev.GetRetiredPages(cause.c)
			if pages == nil {
				pages = []uint64{}
			}
			return pages, ret
		})
	}
	d.call("GetRetiredPagesPendingStatus", nil, func(dev Device) (any, nvml.Return) { return dev.GetRetiredPagesPendingStatus() })
	d.call("GetRemappedRows", nil, func(dev Device) (any, nvml.Return) {
		corr, unc, pending, failed, ret := dev.GetRemappedRows()
		return map[string]any{"corrRows": corr, "uncRows": unc, "isPending": pending, "failureOccurred": failed}, ret
	})
}

func (d *deviceCensus) processes() {
	d.call("GetComputeRunningProcesses", nil, func(dev Device) (any, nvml.Return) {
		ps, ret := dev.GetComputeRunningProcesses()
		return nonNil(ps), ret
	})
	d.call("GetGraphicsRunningProcesses", nil, func(dev Device) (any, nvml.Return) {
		ps, ret := dev.GetGraphicsRunningProcesses()
		return nonNil(ps), ret
	})
	// lastSeenTimeStamp 0: every sample the driver holds.
	d.call("GetProcessUtilization", []any{0}, func(dev Device) (any, nvml.Return) {
		s, ret := dev.GetProcessUtilization(0)
		return nonNil(s), ret
	})
}

// censusEventTypes are the event types the census registers one by one:
// nvml.h's nvmlEventType* the agent may register, and nvmlEventTypeAll.
var censusEventTypes = []uint64{
	nvml.EventTypeSingleBitEccError,
	nvml.EventTypeDoubleBitEccError,
	nvml.EventTypePState,
	nvml.EventTypeXidCriticalError,
	nvml.EventTypeClock,
	nvml.EventTypePowerSourceChange,
	nvml.EventMigConfigChange,
	nvml.EventTypeAll,
}

// censusEvents creates one event set per censusEventTypes entry,
// registers that type on every GPU and frees it; then one set registered
// as the agent's EventWatcher does (EventTypes, XIDs alone where the GPU
// answers NOT_SUPPORTED), waited on once for wait.
func (o *Owner) censusEvents(ctx context.Context, lib *censusLane, gpus []*gpuCensus, wait time.Duration) []CensusEventSet {
	var sets []CensusEventSet
	for _, mask := range censusEventTypes {
		es := CensusEventSet{EventTypes: eventTypesName(mask), Mask: mask}
		set, ok := censusEventSet(lib, &es)
		if ok {
			es.Calls = append(es.Calls, registerAll(ctx, o, gpus, func(dl *censusLane, g *gpuCensus) []CensusCall {
				return []CensusCall{register(dl, g, mask, set)}
			})...)
			es.Calls = append(es.Calls, lib.call("EventSet.Free", nil, func(Device) (any, nvml.Return) { return nil, set.Free() }))
		}
		sets = append(sets, es)
	}

	es := CensusEventSet{EventTypes: eventTypesName(EventTypes), Mask: EventTypes}
	set, ok := censusEventSet(lib, &es)
	if ok {
		es.Calls = append(es.Calls, registerAll(ctx, o, gpus, func(dl *censusLane, g *gpuCensus) []CensusCall {
			c := register(dl, g, EventTypes, set)
			if !c.is(nvml.ERROR_NOT_SUPPORTED) {
				return []CensusCall{c}
			}
			return []CensusCall{c, register(dl, g, nvml.EventTypeXidCriticalError, set)}
		})...)
		ms := uint32(wait.Milliseconds())
		es.Calls = append(es.Calls, lib.call("EventSet.Wait", []any{ms}, func(Device) (any, nvml.Return) {
			e, ret := set.Wait(ms)
			return eventJSON(e, gpus), ret
		}))
		es.Calls = append(es.Calls, lib.call("EventSet.Free", nil, func(Device) (any, nvml.Return) { return nil, set.Free() }))
	}
	return append(sets, es)
}

// censusEventSet creates an event set and records the call in es.
func censusEventSet(lib *censusLane, es *CensusEventSet) (EventSet, bool) {
	var set EventSet
	c := lib.call("EventSetCreate", nil, func(Device) (any, nvml.Return) {
		s, ret := lib.o.lib.EventSetCreate()
		set = s
		return nil, ret
	})
	es.Calls = append(es.Calls, c)
	return set, c.is(nvml.SUCCESS) && set != nil
}

// registerAll runs reg for every GPU, each on its lane and all at once,
// and returns the calls in GPU order.
func registerAll(ctx context.Context, o *Owner, gpus []*gpuCensus, reg func(*censusLane, *gpuCensus) []CensusCall) []CensusCall {
	out := make([][]CensusCall, len(gpus))
	var wg sync.WaitGroup
	for i, g := range gpus {
		if g.uuid == "" {
			c := CensusCall{Method: "RegisterEvents", Device: &g.index, Ret: CensusNotCalled, Error: "not called: the GPU's UUID is unknown"}
			out[i] = []CensusCall{c}
			continue
		}
		wg.Go(func() { out[i] = reg(o.gpuCensusLane(ctx, g.uuid), g) })
	}
	wg.Wait()
	return slices.Concat(out...)
}

// register registers mask on g for set.
func register(dl *censusLane, g *gpuCensus, mask uint64, set EventSet) CensusCall {
	c := dl.call("RegisterEvents", []any{eventTypesName(mask)}, func(dev Device) (any, nvml.Return) {
		return nil, dev.RegisterEvents(mask, set)
	})
	c.Device = &g.index
	return c
}

func intPtr(v any) *int {
	n, ok := v.(int)
	if !ok {
		return nil
	}
	return &n
}

// nonNil makes a nil list an empty one, so an empty answer reads [] and
// not as a missing value.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

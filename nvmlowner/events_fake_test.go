package nvmlowner

import (
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeEvents is an nvml.Interface whose event sets are fed by the test and
// which logs every event-set call in order ("create 1", "register 1
// GPU-0 0x...", "free 1"), so tests can check what happened before what.
type fakeEvents struct {
	*mock.Interface
	mu        sync.Mutex
	log       []string
	sets      []*fakeSet
	createRet nvml.Return
	// waitRet, when not SUCCESS, is what every Wait answers.
	waitRet nvml.Return
	// regRet is RegisterEvents' answer per GPU for the full mask
	// (SUCCESS when absent); xidRet the answer for XIDs alone.
	regRet map[string]nvml.Return
	xidRet map[string]nvml.Return
	devs   map[string]*mock.Device
}

// fakeSet is one event set: events and Wait failures queued by the test.
type fakeSet struct {
	f      *fakeEvents
	id     int
	events chan nvml.EventData
	fail   chan nvml.Return
}

func (s *fakeSet) Wait(ms uint32) (nvml.EventData, nvml.Return) {
	s.f.mu.Lock()
	ret := s.f.waitRet
	s.f.mu.Unlock()
	if ret != nvml.SUCCESS {
		return nvml.EventData{}, ret
	}
	select {
	case ret := <-s.fail:
		return nvml.EventData{}, ret
	default:
	}
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case ret := <-s.fail:
		return nvml.EventData{}, ret
	case e := <-s.events:
		return e, nvml.SUCCESS
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

func (s *fakeSet) Free() nvml.Return {
	s.f.record("free %d", s.id)
	return nvml.SUCCESS
}

func newFakeEvents(uuids ...string) *fakeEvents {
	f := &fakeEvents{Interface: &mock.Interface{}, createRet: nvml.SUCCESS, waitRet: nvml.SUCCESS,
		regRet: map[string]nvml.Return{}, xidRet: map[string]nvml.Return{}, devs: map[string]*mock.Device{}}
	for _, u := range uuids {
		f.devs[u] = f.newDevice(u)
	}
	f.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if d := f.devs[uuid]; d != nil {
			return d, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	f.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.createRet != nvml.SUCCESS {
			f.log = append(f.log, "create "+f.createRet.String())
			return nil, f.createRet
		}
		s := &fakeSet{f: f, id: len(f.sets) + 1, events: make(chan nvml.EventData, 64), fail: make(chan nvml.Return, 8)}
		f.sets = append(f.sets, s)
		f.log = append(f.log, fmt.Sprintf("create %d", s.id))
		return s, nvml.SUCCESS
	}
	return f
}

func (f *fakeEvents) newDevice(uuid string) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		RegisterEventsFunc: func(mask uint64, set nvml.EventSet) nvml.Return {
			f.mu.Lock()
			defer f.mu.Unlock()
			ret, ok := f.regRet[uuid]
			if mask == nvml.EventTypeXidCriticalError {
				ret, ok = f.xidRet[uuid]
			}
			if !ok {
				ret = nvml.SUCCESS
			}
			id := -1
			if s, ok := set.(*fakeSet); ok {
				id = s.id
			}
			f.log = append(f.log, fmt.Sprintf("register %d %s %#x %s", id, uuid, mask, ret))
			return ret
		},
	}
}

func (f *fakeEvents) record(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf(format, a...))
}

func (f *fakeEvents) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

// current is the newest set (nil before the first).
func (f *fakeEvents) current() *fakeSet {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sets) == 0 {
		return nil
	}
	return f.sets[len(f.sets)-1]
}

func (f *fakeEvents) creates() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sets)
}

func (f *fakeEvents) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

// xid is an XID event from dev, not tied to a MIG instance.
func xid(dev nvml.Device, x uint64) nvml.EventData {
	return nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: x,
		GpuInstanceId: NoInstance, ComputeInstanceId: NoInstance}
}

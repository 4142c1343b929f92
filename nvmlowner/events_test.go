package nvmlowner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
	clocktesting "k8s.io/utils/clock/testing"
)

// testRetry is the watchers' retry period; their clock is fake, so it
// passes only when a test steps it.
const testRetry = time.Minute

// watch is a running EventWatcher and what it reported.
type watch struct {
	w      *EventWatcher
	clk    *clocktesting.FakeClock
	events chan Event
	states chan error
	noData chan string
}

// startWatcher runs a watcher over lib for uuids until the test ends.
func startWatcher(t *testing.T, lib Library, uuids ...string) *watch {
	t.Helper()
	w := &watch{clk: clocktesting.NewFakeClock(time.Now()), events: make(chan Event, 4096),
		states: make(chan error, 256), noData: make(chan string, 256)}
	w.w = NewEventWatcher(New(lib, Config{}, nil), EventConfig{
		Wait: 5 * time.Millisecond, Retry: testRetry, Clock: w.clk,
		OnEvent:  func(e Event) { w.events <- e },
		OnState:  func(err error) { w.states <- err },
		OnNoData: func(call, uuid string) { w.noData <- call + " " + uuid },
	})
	w.w.SetGPUs(uuids)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := w.w.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// bounded waits for ch, failing the test (not hanging it) if it never
// comes.
func bounded[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

func (w *watch) ready(t *testing.T) {
	t.Helper()
	bounded(t, "event set ready", w.w.Ready())
}

// state is the next OnState report.
func (w *watch) state(t *testing.T) error {
	t.Helper()
	return bounded(t, "state report", w.states)
}

// noFaults fails the test if the watcher reported a failure so far.
func (w *watch) noFaults(t *testing.T) {
	t.Helper()
	for {
		select {
		case err := <-w.states:
			if err != nil {
				t.Fatalf("fault reported: %v", err)
			}
		default:
			return
		}
	}
}

// waitersThenStep steps the fake clock by d once the watcher sleeps on it.
func (w *watch) waitersThenStep(t *testing.T, d time.Duration) {
	t.Helper()
	testutil.WaitFor(t, "the watcher to wait for its retry", w.clk.HasWaiters)
	w.clk.Step(d)
}

func regLine(set int, uuid string, mask uint64, ret nvml.Return) string {
	return fmt.Sprintf("register %d %s %#x %s", set, uuid, mask, ret)
}

func TestEventWatcherDecode(t *testing.T) {
	f := newFakeEvents("GPU-0", "GPU-1")
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1")
	w.ready(t)
	sentinel := xid(f.devs["GPU-0"], 9999)
	tests := []struct {
		name string
		in   nvml.EventData
		want *Event // nil: not delivered
	}{
		{"registered handle, no GetUUID call", xid(f.devs["GPU-1"], 79),
			&Event{UUID: "GPU-1", Type: nvml.EventTypeXidCriticalError, Data: 79, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"another handle of a wanted gpu", xid(&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-0", nvml.SUCCESS }}, 48),
			&Event{UUID: "GPU-0", Type: nvml.EventTypeXidCriticalError, Data: 48, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"null handle: GetUUID answers INVALID_ARGUMENT", xid(&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "", nvml.ERROR_INVALID_ARGUMENT }}, 79),
			&Event{Type: nvml.EventTypeXidCriticalError, Data: 79, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"nil device", xid(nil, 13),
			&Event{Type: nvml.EventTypeXidCriticalError, Data: 13, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"handle whose GetUUID panics", xid(&mock.Device{}, 13),
			&Event{Type: nvml.EventTypeXidCriticalError, Data: 13, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"MIG instance IDs kept", nvml.EventData{Device: f.devs["GPU-1"], EventType: nvml.EventTypeXidCriticalError, EventData: 31, GpuInstanceId: 2, ComputeInstanceId: NoInstance},
			&Event{UUID: "GPU-1", Type: nvml.EventTypeXidCriticalError, Data: 31, GPUInstance: 2, ComputeInstance: NoInstance}},
		{"double-bit ECC event", nvml.EventData{Device: f.devs["GPU-0"], EventType: nvml.EventTypeDoubleBitEccError, GpuInstanceId: NoInstance, ComputeInstanceId: NoInstance},
			&Event{UUID: "GPU-0", Type: nvml.EventTypeDoubleBitEccError, GPUInstance: NoInstance, ComputeInstance: NoInstance}},
		{"gpu not in the set: dropped", xid(&mock.Device{GetUUIDFunc: func() (string, nvml.Return) { return "GPU-9", nvml.SUCCESS }}, 79), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f.current().events <- tc.in
			f.current().events <- sentinel
			got := bounded(t, "event", w.events)
			if tc.want == nil {
				if got.Data != 9999 {
					t.Fatalf("delivered %+v, want it dropped", got)
				}
				return
			}
			if got != *tc.want {
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			}
			if s := bounded(t, "sentinel", w.events); s.Data != 9999 {
				t.Fatalf("extra event %+v", s)
			}
		})
	}
	if n := len(f.devs["GPU-1"].GetUUIDCalls()); n != 0 {
		t.Errorf("GetUUID called %d times on a registered handle", n)
	}
}

// TestEventWatcherKeepsSet: SetGPUs with an unchanged GPU set (every
// rescan) keeps the set; GPUs that appear are registered on it, GPUs that
// leave have their events dropped, and come back registered again.
func TestEventWatcherKeepsSet(t *testing.T) {
	f := newFakeEvents("GPU-0", "GPU-1", "GPU-2")
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1")
	w.ready(t)
	for range 1000 {
		w.w.SetGPUs([]string{"GPU-1", "GPU-0"})
		if !w.w.Listening() {
			t.Fatal("an unchanged GPU set made the watcher stop listening")
		}
	}
	if n := f.creates(); n != 1 {
		t.Fatalf("%d event sets created over 1,000 unchanged rescans, want 1", n)
	}

	w.w.SetGPUs([]string{"GPU-0", "GPU-1", "GPU-2"})
	w.ready(t)
	if !slices.Contains(f.calls(), regLine(1, "GPU-2", EventTypes, nvml.SUCCESS)) {
		t.Fatalf("GPU-2 not registered on the kept set: %q", f.calls())
	}

	w.w.SetGPUs([]string{"GPU-0", "GPU-2"})
	w.ready(t)
	f.current().events <- xid(f.devs["GPU-1"], 79)
	f.current().events <- xid(f.devs["GPU-2"], 48)
	if e := bounded(t, "event", w.events); e.UUID != "GPU-2" {
		t.Fatalf("got %+v first, want GPU-1's event dropped", e)
	}

	w.w.SetGPUs([]string{"GPU-0", "GPU-1", "GPU-2"})
	w.ready(t)
	f.current().events <- xid(f.devs["GPU-1"], 79)
	if e := bounded(t, "event", w.events); e.UUID != "GPU-1" || e.Data != 79 {
		t.Fatalf("got %+v, want GPU-1's xid 79 after it came back", e)
	}
	if got := strings.Count(strings.Join(f.calls(), "\n"), "register 1 GPU-1 "); got != 2 {
		t.Errorf("GPU-1 registered %d times on the kept set, want 2 (again when it came back): %q", got, f.calls())
	}
	if n := f.creates(); n != 1 {
		t.Errorf("%d event sets created, want 1", n)
	}
	w.noFaults(t)
}

// TestEventWatcherRebuildNoGap: after Wait fails, the new set is created
// and every GPU registered on it before the old set is freed.
func TestEventWatcherRebuildNoGap(t *testing.T) {
	f := newFakeEvents("GPU-0", "GPU-1", "GPU-2")
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1", "GPU-2")
	w.ready(t)
	if err := w.state(t); err != nil {
		t.Fatalf("first state %v, want nil", err)
	}
	f.current().fail <- nvml.ERROR_UNKNOWN
	if err := w.state(t); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("state after the failed wait: %v, want ERROR_UNKNOWN", err)
	}
	// The rebuilt set proves itself with its first Wait.
	if err := w.state(t); err != nil {
		t.Fatalf("state after the rebuild: %v, want nil", err)
	}
	calls := f.calls()
	freed := slices.Index(calls, "free 1")
	created := slices.Index(calls, "create 2")
	if freed < 0 || created < 0 || created > freed {
		t.Fatalf("set 2 not created before set 1 was freed: %q", calls)
	}
	for _, u := range []string{"GPU-0", "GPU-1", "GPU-2"} {
		if i := slices.Index(calls, regLine(2, u, EventTypes, nvml.SUCCESS)); i < 0 || i > freed {
			t.Errorf("%s not registered on set 2 before set 1 was freed: %q", u, calls)
		}
	}
	f.current().events <- xid(f.devs["GPU-2"], 79)
	if e := bounded(t, "event", w.events); e.UUID != "GPU-2" {
		t.Fatalf("event on the new set: %+v", e)
	}
	if n := f.creates(); n != 2 {
		t.Errorf("%d sets created, want 2", n)
	}
}

// TestEventWatcherWaitFailsAgain: a set whose Wait keeps failing is not
// rebuilt in a loop: the second failure waits for the retry period.
func TestEventWatcherWaitFailsAgain(t *testing.T) {
	f := newFakeEvents("GPU-0")
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0")
	w.ready(t)
	f.set(func() { f.waitRet = nvml.ERROR_UNKNOWN })
	testutil.WaitFor(t, "the retry wait", w.clk.HasWaiters)
	if w.w.Listening() {
		t.Error("listening while the event set fails")
	}
	if n := f.creates(); n != 2 {
		t.Fatalf("%d sets created before the retry period, want 2", n)
	}
	f.set(func() { f.waitRet = nvml.SUCCESS })
	w.clk.Step(testRetry)
	w.ready(t)
	if n := f.creates(); n != 3 {
		t.Fatalf("%d sets created after the retry period, want 3", n)
	}
}

// TestEventWatcherWaitGPULost: Wait failing with GPU_IS_LOST rebuilds the
// set with every other GPU registered as before, reports no fault, and
// registers the lost GPU on the same set once it answers again.
func TestEventWatcherWaitGPULost(t *testing.T) {
	f := newFakeEvents("GPU-0", "GPU-1", "GPU-2")
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1", "GPU-2")
	w.ready(t)
	f.set(func() { f.regRet["GPU-1"] = nvml.ERROR_GPU_IS_LOST })
	f.current().fail <- nvml.ERROR_GPU_IS_LOST
	testutil.WaitFor(t, "set 1 freed", func() bool { return slices.Contains(f.calls(), "free 1") })
	calls := f.calls()
	for _, u := range []string{"GPU-0", "GPU-2"} {
		if !slices.Contains(calls, regLine(2, u, EventTypes, nvml.SUCCESS)) {
			t.Errorf("%s not registered on set 2: %q", u, calls)
		}
	}
	if !w.w.Listening() {
		t.Error("not listening after the rebuild")
	}
	f.set(func() { delete(f.regRet, "GPU-1") })
	w.clk.Step(testRetry)
	testutil.WaitFor(t, "GPU-1 registered again", func() bool {
		return slices.Contains(f.calls(), regLine(2, "GPU-1", EventTypes, nvml.SUCCESS))
	})
	f.current().events <- xid(f.devs["GPU-1"], 79)
	if e := bounded(t, "event", w.events); e.UUID != "GPU-1" {
		t.Fatalf("event %+v", e)
	}
	if n := f.creates(); n != 2 {
		t.Errorf("%d sets created, want 2", n)
	}
	w.noFaults(t)
}

// TestEventWatcherNotSupported: NOT_SUPPORTED is no data, never a fault.
func TestEventWatcherNotSupported(t *testing.T) {
	t.Run("event set create", func(t *testing.T) {
		f := newFakeEvents("GPU-0")
		f.createRet = nvml.ERROR_NOT_SUPPORTED
		w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0")
		if got := bounded(t, "no data", w.noData); got != CallEventSetCreate+" " {
			t.Fatalf("no data %q", got)
		}
		if err := w.state(t); err != nil {
			t.Fatalf("state %v, want nil (no data is no fault)", err)
		}
		// Not retried on a timer, only for a new GPU set.
		w.clk.Step(10 * testRetry)
		w.w.SetGPUs([]string{"GPU-0", "GPU-1"})
		bounded(t, "no data again", w.noData)
		if got := strings.Count(strings.Join(f.calls(), "\n"), "create ERROR_NOT_SUPPORTED"); got != 2 {
			t.Errorf("%d create attempts, want 2: %q", got, f.calls())
		}
		if w.w.Listening() {
			t.Error("listening without an event set")
		}
		w.noFaults(t)
	})
	t.Run("every event type of a gpu", func(t *testing.T) {
		f := newFakeEvents("GPU-0", "GPU-1")
		f.regRet["GPU-1"] = nvml.ERROR_NOT_SUPPORTED
		f.xidRet["GPU-1"] = nvml.ERROR_NOT_SUPPORTED
		w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1")
		w.ready(t)
		if got := bounded(t, "no data", w.noData); got != CallRegisterEvents+" GPU-1" {
			t.Fatalf("no data %q", got)
		}
		f.current().events <- xid(f.devs["GPU-0"], 79)
		if e := bounded(t, "event", w.events); e.UUID != "GPU-0" {
			t.Fatalf("event %+v", e)
		}
		w.noFaults(t)
	})
	t.Run("ECC events of a gpu: XIDs alone", func(t *testing.T) {
		f := newFakeEvents("GPU-0")
		f.regRet["GPU-0"] = nvml.ERROR_NOT_SUPPORTED
		w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0")
		w.ready(t)
		if !slices.Contains(f.calls(), regLine(1, "GPU-0", nvml.EventTypeXidCriticalError, nvml.SUCCESS)) {
			t.Fatalf("no XID-only registration: %q", f.calls())
		}
		select {
		case got := <-w.noData:
			t.Fatalf("no data %q for a GPU that gives XIDs", got)
		default:
		}
		w.noFaults(t)
	})
}

// TestEventWatcherRegisterUnknown: a registration answering ERROR_UNKNOWN
// leaves the set undefined (nvml.h): it is freed, the failure reported,
// and a new set built after the retry period.
func TestEventWatcherRegisterUnknown(t *testing.T) {
	f := newFakeEvents("GPU-0", "GPU-1")
	f.regRet["GPU-1"] = nvml.ERROR_UNKNOWN
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0", "GPU-1")
	if err := w.state(t); !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("state %v, want ERROR_UNKNOWN", err)
	}
	if !slices.Contains(f.calls(), "free 1") {
		t.Fatalf("undefined set not freed: %q", f.calls())
	}
	f.set(func() { delete(f.regRet, "GPU-1") })
	w.waitersThenStep(t, testRetry)
	w.ready(t)
	if err := w.state(t); err != nil {
		t.Fatalf("state %v after the retry, want nil", err)
	}
	if n := f.creates(); n != 2 {
		t.Errorf("%d sets created, want 2", n)
	}
}

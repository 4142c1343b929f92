package nvmlowner

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// fakeLib is a library of two GPUs whose handle lookups are counted.
type fakeLib struct {
	*mock.Interface
	lookups atomic.Int32
	devs    map[string]*mock.Device
}

func newFakeLib() *fakeLib {
	f := &fakeLib{Interface: &mock.Interface{}, devs: map[string]*mock.Device{
		"GPU-a": {}, "GPU-b": {},
	}}
	f.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		f.lookups.Add(1)
		if d, ok := f.devs[uuid]; ok {
			return d, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	f.DeviceGetCountFunc = func() (int, nvml.Return) { return len(f.devs), nvml.SUCCESS }
	return f
}

// waitDone fails the test if ch is not closed within a generous bound: a
// liveness guard, not a timing assertion.
func waitDone(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

func TestDoHungGPUDelaysNoOther(t *testing.T) {
	f := newFakeLib()
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 50 * time.Millisecond}, nil)
	release := make(chan struct{})
	hungStarted := make(chan struct{})
	var hungDone sync.WaitGroup
	hungDone.Add(1)
	go func() {
		defer hungDone.Done()
		err := o.Do(context.Background(), "GPU-a", "hang", func(Device) nvml.Return {
			close(hungStarted)
			<-release
			return nvml.SUCCESS
		})
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("hung call: err %v, want ErrTimeout", err)
		}
	}()
	waitDone(t, hungStarted, "the hung call to start")
	hungDone.Wait()
	if !o.Hung("GPU-a") {
		t.Error("GPU-a not reported hung while its call runs past the timeout")
	}
	// Another GPU answers while GPU-a hangs.
	for range 20 {
		if err := o.Do(context.Background(), "GPU-b", "ok", func(Device) nvml.Return { return nvml.SUCCESS }); err != nil {
			t.Fatalf("GPU-b while GPU-a hangs: %v", err)
		}
	}
	// A second call on the hung GPU is refused without starting.
	started := false
	err := o.Do(context.Background(), "GPU-a", "second", func(Device) nvml.Return { started = true; return nvml.SUCCESS })
	if !errors.Is(err, ErrTimeout) || started {
		t.Fatalf("second call on hung GPU: err %v started %v, want ErrTimeout without starting", err, started)
	}
	close(release)
	// Once the hung call returns, the GPU answers again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := o.Do(context.Background(), "GPU-a", "after", func(Device) nvml.Return { return nvml.SUCCESS })
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GPU-a never answered again: %v", err)
		}
	}
	if o.Hung("GPU-a") {
		t.Error("GPU-a still reported hung after its call returned")
	}
}

func TestDoHandleByUUID(t *testing.T) {
	f := newFakeLib()
	o := New(nvmlapi.Wrap(f), Config{}, nil)
	var got Device
	for range 3 {
		if err := o.Do(context.Background(), "GPU-b", "get", func(d Device) nvml.Return { got = d; return nvml.SUCCESS }); err != nil {
			t.Fatal(err)
		}
	}
	if got != nvmlapi.WrapDevice(f.devs["GPU-b"]) {
		t.Fatal("Do handed over the wrong device")
	}
	if n := f.lookups.Load(); n != 1 {
		t.Fatalf("%d handle lookups for 3 calls, want 1 (cached by UUID)", n)
	}
	// A call that says the handle is stale makes the next one look up again.
	_ = o.Do(context.Background(), "GPU-b", "stale", func(Device) nvml.Return { return nvml.ERROR_INVALID_ARGUMENT })
	_ = o.Do(context.Background(), "GPU-b", "get", func(Device) nvml.Return { return nvml.SUCCESS })
	if n := f.lookups.Load(); n != 2 {
		t.Fatalf("%d lookups after a stale handle, want 2", n)
	}
	// Unknown GPUs fail with NOT_FOUND, errors.Is-able.
	err := o.Do(context.Background(), "GPU-x", "get", func(Device) nvml.Return { return nvml.SUCCESS })
	if !errors.Is(err, nvml.ERROR_NOT_FOUND) {
		t.Fatalf("unknown GPU: %v, want ERROR_NOT_FOUND", err)
	}
	// SetGPUs drops handles of GPUs that left.
	o.SetGPUs([]string{"GPU-a"})
	_ = o.Do(context.Background(), "GPU-b", "get", func(Device) nvml.Return { return nvml.SUCCESS })
	if n := f.lookups.Load(); n != 4 {
		t.Fatalf("%d lookups after SetGPUs dropped GPU-b, want 4", n)
	}
}

func TestDoPanicIsAnError(t *testing.T) {
	o := New(nvmlapi.Wrap(newFakeLib()), Config{}, nil)
	err := o.Do(context.Background(), "GPU-a", "boom", func(Device) nvml.Return { panic("unset mock") })
	if !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("panicking call: %v, want ERROR_UNKNOWN", err)
	}
	if err := o.Do(context.Background(), "GPU-a", "after", func(Device) nvml.Return { return nvml.SUCCESS }); err != nil {
		t.Fatalf("lane not released after a panic: %v", err)
	}
}

func TestLibCanceled(t *testing.T) {
	o := New(nvmlapi.Wrap(newFakeLib()), Config{CallTimeout: time.Hour}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := o.Lib(ctx, "block", func(Library) nvml.Return { <-release; return nvml.SUCCESS })
		if !errors.Is(err, context.Canceled) {
			t.Errorf("canceled call: %v", err)
		}
	}()
	cancel()
	waitDone(t, done, "a canceled call to return")
}

package nvmlowner

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner/nvmlapi"
)

// TestReleaseHoldsCallsBack: while NVML is released calls wait (none
// fails), the library is shut down once and initialised once, handles
// are looked up again afterwards and the generation moves on.
func TestReleaseHoldsCallsBack(t *testing.T) {
	f := newFakeLib()
	var inits, shutdowns atomic.Int32
	f.InitFunc = func() nvml.Return { inits.Add(1); return nvml.SUCCESS }
	f.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 50 * time.Millisecond}, nil)
	if err := o.Do(context.Background(), "GPU-a", "before", func(Device) nvml.Return { return nvml.SUCCESS }); err != nil {
		t.Fatal(err)
	}
	resume, err := o.Release(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if shutdowns.Load() != 1 || inits.Load() != 0 {
		t.Fatalf("shutdowns %d inits %d after the release, want 1, 0", shutdowns.Load(), inits.Load())
	}
	var ran atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- o.Do(context.Background(), "GPU-a", "during", func(Device) nvml.Return {
			ran.Store(true)
			return nvml.SUCCESS
		})
	}()
	// Held back for longer than the call timeout: it neither ran nor
	// failed (a liveness wait, not a timing assertion).
	time.Sleep(200 * time.Millisecond)
	if ran.Load() {
		t.Fatal("a call ran while NVML was released")
	}
	select {
	case err := <-done:
		t.Fatalf("a held call returned %v while NVML was released", err)
	default:
	}
	resume()
	resume() // a second resume does nothing
	select {
	case err := <-done:
		if err != nil || !ran.Load() {
			t.Fatalf("held call after resume: err %v ran %v", err, ran.Load())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held call never ran after resume")
	}
	if inits.Load() != 1 || o.Generation() != 1 {
		t.Errorf("inits %d generation %d after resume, want 1, 1", inits.Load(), o.Generation())
	}
	if n := f.lookups.Load(); n != 2 {
		t.Errorf("%d handle lookups, want 2 (the handle looked up again after the release)", n)
	}
}

// TestReleaseRefusedWhileACallHangs: a call that does not end (a GPU hung
// in the driver) fails the release, which names it; NVML is not shut down
// and other calls go on.
func TestReleaseRefusedWhileACallHangs(t *testing.T) {
	f := newFakeLib()
	var shutdowns atomic.Int32
	f.ShutdownFunc = func() nvml.Return { shutdowns.Add(1); return nvml.SUCCESS }
	f.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	o := New(nvmlapi.Wrap(f), Config{CallTimeout: 50 * time.Millisecond}, nil)
	unhang := make(chan struct{})
	started := make(chan struct{})
	go func() {
		_ = o.Do(context.Background(), "GPU-a", "GetTemperature", func(Device) nvml.Return {
			close(started)
			<-unhang
			return nvml.SUCCESS
		})
	}()
	waitDone(t, started, "the hung call")
	_, err := o.Release(context.Background(), 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "GPU-a: GetTemperature") {
		t.Fatalf("release with a hung call: %v, want an error naming it", err)
	}
	if shutdowns.Load() != 0 {
		t.Fatal("NVML shut down under a running call")
	}
	if err := o.Do(context.Background(), "GPU-b", "other", func(Device) nvml.Return { return nvml.SUCCESS }); err != nil {
		t.Fatalf("another GPU after the refused release: %v", err)
	}
	close(unhang)
	// With the call ended the release works.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resume, err := o.Release(context.Background(), time.Second)
		if err == nil {
			resume()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("release after the call ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestReleaseRebuildsEventSet: the event watcher waits out a release and
// builds a new set under the new NVML session; events still arrive.
func TestReleaseRebuildsEventSet(t *testing.T) {
	f := newFakeEvents("GPU-0")
	f.InitFunc = func() nvml.Return { return nvml.SUCCESS }
	f.ShutdownFunc = func() nvml.Return { return nvml.SUCCESS }
	w := startWatcher(t, nvmlapi.Wrap(f), "GPU-0")
	w.ready(t)
	resume, err := w.w.o.Release(context.Background(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.creates(); n != 1 {
		t.Fatalf("%d sets while released, want 1", n)
	}
	resume()
	testutil.WaitFor(t, "a second event set", func() bool { return f.creates() == 2 })
	testutil.WaitFor(t, "GPU-0 registered on it", func() bool {
		return slices.Contains(f.calls(), regLine(2, "GPU-0", EventTypes, nvml.SUCCESS))
	})
	f.current().events <- xid(f.devs["GPU-0"], 48)
	if e := bounded(t, "event", w.events); e.UUID != "GPU-0" || e.Data != 48 {
		t.Fatalf("event after the release: %+v", e)
	}
	if slices.Contains(f.calls(), "free 1") {
		t.Error("the set of the session before was freed after NVML's shutdown")
	}
	w.noFaults(t)
}

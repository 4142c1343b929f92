package sim

import (
	"runtime"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// within runs f and fails the test if it has not returned within 10s,
// naming what, so a call that blocks when it must not fails rather than
// hanging the test.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s blocked", what)
	}
}

// waitHeld waits until want calls wait at GPU gpu's hang.
func waitHeld(t *testing.T, n *Node, gpu int, want int32) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.gates[gpu].held.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d calls held by the hang of gpu %d", n.gates[gpu].held.Load(), want, gpu)
		}
		runtime.Gosched()
	}
}

func TestHang(t *testing.T) {
	for _, release := range []struct{ name, method, body string }{
		{"cleared", "DELETE", `{"kind":"hang","gpu":1}`},
		{"gpu reset", "POST", `{"kind":"gpu-reset","gpu":1}`},
	} {
		t.Run(release.name, func(t *testing.T) {
			n := newFaultNode(t, WithMIG(1, "3g.40gb", "3g.40gb"))
			lib := n.NVML()
			spec := n.Spec()
			dev0, _ := lib.DeviceGetHandleByIndex(0)
			dev1, _ := lib.DeviceGetHandleByIndex(1)
			mig, ret := dev1.GetMigDeviceHandleByIndex(1)
			if ret != nvml.SUCCESS {
				t.Fatal(ret)
			}
			set := eventSetOn(t, lib, 1)
			mustFault(t, n, "POST", `{"kind":"hang","gpu":1}`)

			// Every call that touches GPU 1 is held.
			held := []struct {
				name string
				call func() nvml.Return
			}{
				{"GetUUID", func() nvml.Return { _, r := dev1.GetUUID(); return r }},
				{"GetMemoryInfo", func() nvml.Return { _, r := dev1.GetMemoryInfo(); return r }},
				{"MIG GetMemoryInfo", func() nvml.Return { _, r := mig.GetMemoryInfo(); return r }},
				{"DeviceGetHandleByIndex", func() nvml.Return { _, r := lib.DeviceGetHandleByIndex(1); return r }},
				{"DeviceGetHandleByUUID", func() nvml.Return { _, r := lib.DeviceGetHandleByUUID(spec.GPUs[1].UUID); return r }},
				{"DeviceGetHandleByUUID of a MIG device", func() nvml.Return {
					_, r := lib.DeviceGetHandleByUUID(spec.GPUs[1].MIG[0].UUID)
					return r
				}},
			}
			type result struct {
				name string
				ret  nvml.Return
			}
			results := make(chan result, len(held))
			for _, c := range held {
				go func() { results <- result{c.name, c.call()} }()
			}
			waitHeld(t, n, 1, int32(len(held)))

			// Nothing else is.
			within(t, "calls not tied to gpu 1", func() {
				if c, ret := lib.DeviceGetCount(); ret != nvml.SUCCESS || c != 8 {
					t.Errorf("DeviceGetCount = %d, %v", c, ret)
				}
				if ret := lib.Init(); ret != nvml.SUCCESS {
					t.Errorf("Init: %v", ret)
				}
				if s, ret := lib.EventSetCreate(); ret != nvml.SUCCESS {
					t.Errorf("EventSetCreate: %v", ret)
				} else {
					s.Free()
				}
				if _, ret := dev0.GetMemoryInfo(); ret != nvml.SUCCESS {
					t.Errorf("gpu 0 GetMemoryInfo: %v", ret)
				}
				if _, ret := lib.DeviceGetHandleByIndex(2); ret != nvml.SUCCESS {
					t.Errorf("DeviceGetHandleByIndex(2): %v", ret)
				}
				if _, ret := set.Wait(1); ret != nvml.ERROR_TIMEOUT {
					t.Errorf("event set Wait: %v, want ERROR_TIMEOUT", ret)
				}
			})
			select {
			case r := <-results:
				t.Fatalf("%s returned (%v) while gpu 1 hangs", r.name, r.ret)
			default:
			}

			mustFault(t, n, release.method, release.body)
			for range held {
				select {
				case r := <-results:
					if r.ret != nvml.SUCCESS {
						t.Errorf("%s after the hang: %v", r.name, r.ret)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("held calls not released by %s %s", release.method, release.body)
				}
			}
			within(t, "GetUUID after the hang", func() {
				if _, ret := dev1.GetUUID(); ret != nvml.SUCCESS {
					t.Errorf("GetUUID: %v", ret)
				}
			})
		})
	}
}

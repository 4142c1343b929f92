package nvmlowner_test

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// countingLib counts the NVML calls discovery makes, by name.
type countingLib struct {
	nvmlowner.Library
	mu    sync.Mutex
	calls map[string]int
}

func newCountingLib(lib nvmlowner.Library) *countingLib {
	return &countingLib{Library: lib, calls: map[string]int{}}
}

func (c *countingLib) count(name string) {
	c.mu.Lock()
	c.calls[name]++
	c.mu.Unlock()
}

// take returns the counts so far, and the total, and starts again.
func (c *countingLib) take() (map[string]int, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out, total := c.calls, 0
	for _, n := range out {
		total += n
	}
	c.calls = map[string]int{}
	return out, total
}

func (c *countingLib) DeviceGetCount() (int, nvml.Return) {
	c.count("DeviceGetCount")
	return c.Library.DeviceGetCount()
}

func (c *countingLib) DeviceGetHandleByIndex(i int) (nvmlowner.Device, nvml.Return) {
	c.count("DeviceGetHandleByIndex")
	dev, ret := c.Library.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return countingDevice{dev, c}, ret
}

func (c *countingLib) DeviceGetHandleByUUID(uuid string) (nvmlowner.Device, nvml.Return) {
	c.count("DeviceGetHandleByUUID")
	dev, ret := c.Library.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	return countingDevice{dev, c}, ret
}

type countingDevice struct {
	nvmlowner.Device
	c *countingLib
}

func (d countingDevice) GetUUID() (string, nvml.Return) {
	d.c.count("GetUUID")
	return d.Device.GetUUID()
}
func (d countingDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	d.c.count("GetPciInfo")
	return d.Device.GetPciInfo()
}
func (d countingDevice) GetName() (string, nvml.Return) {
	d.c.count("GetName")
	return d.Device.GetName()
}
func (d countingDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	d.c.count("GetMemoryInfo")
	return d.Device.GetMemoryInfo()
}
func (d countingDevice) GetMinorNumber() (int, nvml.Return) {
	d.c.count("GetMinorNumber")
	return d.Device.GetMinorNumber()
}
func (d countingDevice) GetMigMode() (int, int, nvml.Return) {
	d.c.count("GetMigMode")
	return d.Device.GetMigMode()
}
func (d countingDevice) GetNvLinkState(l int) (nvml.EnableState, nvml.Return) {
	d.c.count("GetNvLinkState")
	return d.Device.GetNvLinkState(l)
}
func (d countingDevice) GetNvLinkRemoteDeviceType(l int) (nvml.IntNvLinkDeviceType, nvml.Return) {
	d.c.count("GetNvLinkRemoteDeviceType")
	return d.Device.GetNvLinkRemoteDeviceType(l)
}
func (d countingDevice) GetNvLinkRemotePciInfo(l int) (nvml.PciInfo, nvml.Return) {
	d.c.count("GetNvLinkRemotePciInfo")
	return d.Device.GetNvLinkRemotePciInfo(l)
}
func (d countingDevice) GetTopologyCommonAncestor(other nvmlowner.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	d.c.count("GetTopologyCommonAncestor")
	if o, ok := other.(countingDevice); ok {
		other = o.Device
	}
	return d.Device.GetTopologyCommonAncestor(other)
}

// TestRediscoverReusesLinks: with Previous and an unchanged GPU set the
// NVLink remote and common-ancestor queries are skipped and the links are
// the same; a changed set queries them again.
func TestRediscoverReusesLinks(t *testing.T) {
	ctx := context.Background()
	for _, profile := range []string{"dgx-h100", "dgx-1v", "dgx-2"} {
		t.Run(profile, func(t *testing.T) {
			spec, err := sim.Profile(profile)
			if err != nil {
				t.Fatal(err)
			}
			n := simulate(t, spec)
			lib := newCountingLib(n.NVML())
			d := nvmlowner.NewDiscoverer(nvmlowner.New(lib, nvmlowner.Config{CallTimeout: time.Minute}, nil), n.HostRoot(), nil)
			first, err := d.Discover(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			firstCalls, full := lib.take()
			again, err := d.Discover(ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			calls, reused := lib.take()
			t.Logf("%s: %d nvml calls without Previous, %d with", profile, full, reused)
			for _, name := range []string{"GetNvLinkState", "GetNvLinkRemoteDeviceType", "GetNvLinkRemotePciInfo", "GetTopologyCommonAncestor"} {
				if calls[name] != 0 {
					t.Errorf("unchanged gpu set: %d %s calls, want 0", calls[name], name)
				}
			}
			if reused*3 > full {
				t.Errorf("unchanged gpu set: %d calls, want well under a third of a full discovery's %d", reused, full)
			}
			if !reflect.DeepEqual(again, first) {
				t.Errorf("rediscovery with Previous differs:\n got  %+v\n want %+v", again, first)
			}

			// A different set (here: a GPU that was lost and is back) queries the links again.
			changed := *first
			changed.GPUs = append([]topology.GPU(nil), first.GPUs...)
			changed.GPUs[1].Lost = true
			changed.Links = nil
			third, err := d.Discover(ctx, &changed)
			if err != nil {
				t.Fatal(err)
			}
			// The first discovery also looked up each GPU's handle by
			// UUID, which the owner keeps: compare the link queries.
			calls, _ = lib.take()
			for _, name := range []string{"GetNvLinkState", "GetNvLinkRemoteDeviceType", "GetTopologyCommonAncestor"} {
				if calls[name] == 0 || calls[name] != firstCalls[name] {
					t.Errorf("changed gpu set: %d %s calls, want a full discovery's %d", calls[name], name, firstCalls[name])
				}
			}
			if !reflect.DeepEqual(third.Links, first.Links) {
				t.Errorf("links recomputed after a change differ from the first discovery's")
			}
		})
	}
}

// hangLib makes one GPU's GetMemoryInfo block until release is closed, as
// a GPU in a GSP timeout (XID 119) blocks NVML callers.
type hangLib struct {
	nvmlowner.Library
	index   int
	uuid    string // GPU index's
	release chan struct{}
	entered atomic.Int32
}

func (h *hangLib) DeviceGetHandleByIndex(i int) (nvmlowner.Device, nvml.Return) {
	dev, ret := h.Library.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return dev, ret
	}
	return hangDevice{dev, h, i == h.index}, ret
}

func (h *hangLib) DeviceGetHandleByUUID(uuid string) (nvmlowner.Device, nvml.Return) {
	dev, ret := h.Library.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return dev, ret
	}
	return hangDevice{dev, h, uuid == h.uuid}, ret
}

type hangDevice struct {
	nvmlowner.Device
	h    *hangLib
	hung bool
}

func (d hangDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if d.hung {
		d.h.entered.Add(1)
		<-d.h.release
	}
	return d.Device.GetMemoryInfo()
}

// GetTopologyCommonAncestor hands the simulator its own device.
func (d hangDevice) GetTopologyCommonAncestor(other nvmlowner.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	if o, ok := other.(hangDevice); ok {
		other = o.Device
	}
	return d.Device.GetTopologyCommonAncestor(other)
}

// TestDiscoverHungGPU: a GPU whose read does not return within the call
// timeout is kept Lost with the call it hung in; the other GPUs are read
// in full; the next discovery does not call the hung GPU again while its
// call is still running (its lane is held), and reads it normally once
// it returns.
func TestDiscoverHungGPU(t *testing.T) {
	ctx := context.Background()
	spec, err := sim.Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n := simulate(t, spec)
	lib := &hangLib{Library: n.NVML(), index: 2, uuid: n.Spec().GPUs[2].UUID, release: make(chan struct{})}
	defer func() {
		select {
		case <-lib.release:
		default:
			close(lib.release)
		}
	}()
	// The timeout only has to expire while GetMemoryInfo blocks; its length
	// is not asserted on.
	o := nvmlowner.New(lib, nvmlowner.Config{CallTimeout: 100 * time.Millisecond}, nil)
	d := nvmlowner.NewDiscoverer(o, n.HostRoot(), nil)

	tests := []struct {
		name       string
		wantReason string
	}{
		{"hung in GetMemoryInfo", "nvml-timeout: GetMemoryInfo"},
		{"earlier call still running", "nvml-timeout: GetMemoryInfo (an earlier call on this gpu is still running)"},
	}
	var prev *topology.Node
	for _, tc := range tests {
		got, err := d.Discover(ctx, prev)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		prev = got
		g := got.GPUs[2]
		if !g.Lost || g.LostReason != tc.wantReason {
			t.Errorf("%s: gpu 2 lost %t reason %q, want lost, %q", tc.name, g.Lost, g.LostReason, tc.wantReason)
		}
		if g.UUID != spec.GPUs[2].UUID || g.PCIBusID != spec.GPUs[2].PCIBusID {
			t.Errorf("%s: gpu 2 identity %s %s, want the one read before it hung", tc.name, g.UUID, g.PCIBusID)
		}
		for i, other := range got.GPUs {
			if i != 2 && !reflect.DeepEqual(other, spec.GPUs[i]) {
				t.Errorf("%s: gpu %d:\n got  %+v\n want %+v", tc.name, i, other, spec.GPUs[i])
			}
		}
		if l := got.Link(0, 1); l.NVLinks != 18 {
			t.Errorf("%s: pair 0-1 %d nvlinks, want 18", tc.name, l.NVLinks)
		}
		if l := got.Link(0, 2); l.NVLinks != 0 || l.PCIe != "" {
			t.Errorf("%s: pair 0-2 of a hung gpu: %+v, want no link", tc.name, l)
		}
		if !o.Hung(spec.GPUs[2].UUID) {
			t.Errorf("%s: owner does not report gpu 2 hung", tc.name)
		}
	}
	if e := lib.entered.Load(); e != 1 {
		t.Errorf("hung GetMemoryInfo entered %d times, want 1 (no second call on a hung gpu)", e)
	}

	close(lib.release)
	// The late result is dropped; the lane frees when the call returns,
	// which nothing signals: wait for it, bounded.
	for deadline := time.Now().Add(10 * time.Second); o.Hung(spec.GPUs[2].UUID); {
		if time.Now().After(deadline) {
			t.Fatal("hung call still holds the lane 10s after it returned")
		}
		time.Sleep(time.Millisecond)
	}
	got, err := d.Discover(ctx, prev)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.GPUs, spec.GPUs) {
		t.Errorf("after the gpu answers again: gpus differ from the profile")
	}
	if !reflect.DeepEqual(got.Links, spec.Links) {
		t.Errorf("after the gpu answers again: links differ from the profile")
	}
}

// BenchmarkRediscover measures a steady-state rescan of a simulated node:
// a full discovery, and one given the previous node (links reused).
func BenchmarkRediscover(b *testing.B) {
	for _, name := range []string{"dgx-h100", "dgx-2"} {
		spec, err := sim.Profile(name)
		if err != nil {
			b.Fatal(err)
		}
		n, err := sim.New(spec, b.TempDir(), nil)
		if err != nil {
			b.Fatal(err)
		}
		for _, withPrevious := range []bool{false, true} {
			mode := "full"
			if withPrevious {
				mode = "previous"
			}
			b.Run(name+"/"+mode, func(b *testing.B) {
				lib := newCountingLib(n.NVML())
				d := nvmlowner.NewDiscoverer(nvmlowner.New(lib, nvmlowner.Config{CallTimeout: time.Minute}, nil), n.HostRoot(), nil)
				prev, err := d.Discover(context.Background(), nil)
				if err != nil {
					b.Fatal(err)
				}
				lib.take()
				for b.Loop() {
					var previous *topology.Node
					if withPrevious {
						previous = prev
					}
					if _, err := d.Discover(context.Background(), previous); err != nil {
						b.Fatal(err)
					}
				}
				_, calls := lib.take()
				b.ReportMetric(float64(calls)/float64(b.N), "nvmlcalls/op")
			})
		}
	}
}

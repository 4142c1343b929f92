package rdma

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
)

// newTestNetns creates a named network namespace, removed when the test
// ends, and a netlink handle inside it. It skips when the test cannot
// create namespaces (not root / no CAP_NET_ADMIN).
func newTestNetns(t *testing.T) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN)")
	}
	name := fmt.Sprintf("rdma-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	// NewNamed switches the calling thread into the new namespace: do it
	// on a locked thread and switch back before unlocking.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("get current netns: %v", err)
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			t.Skipf("cannot create a network namespace: %v", err)
		}
		t.Fatalf("create netns %s: %v", name, err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("return to the original netns: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", name, err)
	}
	t.Cleanup(h.Close)
	return ns, h
}

// addLinks creates dummy0 (MTU 9000) and the veth pair veth0 (MTU 4092) /
// veth1. Kernels built without the dummy driver get a port-less bridge
// named dummy0 instead: it reports the same states (admin up, operstate
// unknown) for what these tests check.
func addLinks(t *testing.T, h *netlink.Handle) {
	t.Helper()
	attrs := netlink.LinkAttrs{Name: "dummy0", MTU: 9000}
	if err := h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs}); err != nil {
		if !errors.Is(err, unix.EOPNOTSUPP) {
			t.Fatalf("add dummy0: %v", err)
		}
		t.Logf("kernel has no dummy driver (%v): using a port-less bridge as dummy0", err)
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			t.Fatalf("add bridge dummy0: %v", err)
		}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth0", MTU: 4092}, PeerName: "veth1"}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth0/veth1: %v", err)
	}
}

func setUp(t *testing.T, h *netlink.Handle, name string, up bool) {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if up {
		err = h.LinkSetUp(l)
	} else {
		err = h.LinkSetDown(l)
	}
	if err != nil {
		t.Fatalf("set %s up=%v: %v", name, up, err)
	}
}

func TestNetlinkLinkState(t *testing.T) {
	ns, h := newTestNetns(t)
	addLinks(t, h)
	nl, err := NewNetlink(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()

	setUp(t, h, "dummy0", true)
	setUp(t, h, "veth0", true) // peer still down: no carrier
	tests := []struct {
		name string
		want LinkInfo
	}{
		{"dummy0", LinkInfo{Name: "dummy0", OperState: "unknown", AdminUp: true, MTU: 9000}},
		{"veth0", LinkInfo{Name: "veth0", OperState: "lower-layer-down", AdminUp: true, MTU: 4092}},
		{"veth1", LinkInfo{Name: "veth1", OperState: "down", AdminUp: false, MTU: 4092}}, // a veth peer takes the MTU it is created with
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := nl.Link(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Link(%s) = %+v, want %+v", tt.name, got, tt.want)
			}
		})
	}
	if _, err := nl.Link("ib0"); !errors.Is(err, ErrLinkNotFound) {
		t.Errorf("Link(ib0) error = %v, want ErrLinkNotFound", err)
	}
	// This kernel may have no RDMA netlink family; either answer is fine,
	// but a mode must be one the kernel defines.
	if mode, err := nl.NetnsMode(); err != nil {
		t.Logf("NetnsMode: %v (no RDMA in this kernel)", err)
	} else if mode != "shared" && mode != "exclusive" {
		t.Errorf("NetnsMode = %q, want shared or exclusive", mode)
	}
}

func TestNetlinkSubscribe(t *testing.T) {
	ns, h := newTestNetns(t)
	addLinks(t, h)
	nl, err := NewNetlink(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := make(chan LinkInfo, 64)
	if err := nl.Subscribe(ctx, events, func(err error) { t.Errorf("subscription error: %v", err) }); err != nil {
		t.Fatal(err)
	}
	// waitFor drains events until one for name matches want.
	waitFor := func(name string, want func(LinkInfo) bool, what string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case ev := <-events:
				if ev.Name == name && want(ev) {
					return
				}
			case <-deadline:
				t.Fatalf("no event: %s", what)
			}
		}
	}
	setUp(t, h, "veth1", true)
	setUp(t, h, "veth0", true)
	waitFor("veth0", func(l LinkInfo) bool { return l.AdminUp && l.OperState == "up" }, "veth0 up")
	setUp(t, h, "veth1", false)
	waitFor("veth0", func(l LinkInfo) bool { return l.OperState == "lower-layer-down" }, "veth0 loses its peer")
	setUp(t, h, "dummy0", true)
	waitFor("dummy0", func(l LinkInfo) bool { return l.AdminUp }, "dummy0 admin up")
	setUp(t, h, "dummy0", false)
	waitFor("dummy0", func(l LinkInfo) bool { return !l.AdminUp && l.OperState == "down" }, "dummy0 down")
	d, err := h.LinkByName("dummy0")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(d); err != nil {
		t.Fatal(err)
	}
	waitFor("dummy0", func(l LinkInfo) bool { return l.OperState == "not-present" }, "dummy0 deleted")
}

// TestWatcherRealNetlink runs the Watcher on a fixture whose port netdev is
// a real veth in a test namespace: link changes reach the observer through
// netlink events alone (the poll interval is an hour).
func TestWatcherRealNetlink(t *testing.T) {
	ns, h := newTestNetns(t)
	addLinks(t, h)
	setUp(t, h, "veth1", true)
	setUp(t, h, "veth0", true)
	nl, err := NewNetlink(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	root := t.TempDir()
	tree := fixtures["roce"]
	tree.HCAs = append([]fakesys.HCA(nil), tree.HCAs...)
	tree.HCAs[0].NetDevs = []fakesys.NetDev{{Name: "veth0"}}
	tree.HCAs[0].Ports = []fakesys.Port{{Number: 1, LinkLayer: "Ethernet", GIDNetDevs: []string{"veth0"}, UMAD: "umad0"}}
	if err := fakesys.Write(root, tree); err != nil {
		t.Fatal(err)
	}
	obs := startWatcher(t, root, nl, time.Hour)
	if o := next(t, obs); o != (observation{"mlx5_4", true, ""}) {
		t.Fatalf("initial = %+v, want healthy", o)
	}
	steps := []struct {
		name string
		link string
		up   bool
		want observation
	}{
		{"peer down", "veth1", false, observation{"mlx5_4", false, "netdev veth0 operstate is lower-layer-down"}},
		{"peer up", "veth1", true, observation{"mlx5_4", true, ""}},
		{"admin down", "veth0", false, observation{"mlx5_4", false, "netdev veth0 is administratively down (operstate down)"}},
		{"admin up", "veth0", true, observation{"mlx5_4", true, ""}},
	}
	for _, s := range steps {
		start := time.Now()
		setUp(t, h, s.link, s.up)
		// A link passes through intermediate states (admin up before
		// carrier): wait for the final one, logging what came before.
		for {
			got := next(t, obs)
			if got == s.want {
				t.Logf("%s: observed after %v", s.name, time.Since(start))
				break
			}
			if got.healthy {
				t.Fatalf("%s: observed %+v, want %+v", s.name, got, s.want)
			}
			t.Logf("%s: intermediate %+v", s.name, got)
		}
	}
}

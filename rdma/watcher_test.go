package rdma

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/rdma/fakesys"
)

type observation struct {
	id      string
	healthy bool
	reason  string
}

// eventLinks is a Links whose link state the test sets and whose events
// the test sends.
type eventLinks struct {
	mu     sync.Mutex
	links  map[string]LinkInfo
	events chan<- LinkInfo
	ready  chan struct{}
}

func (e *eventLinks) NetnsMode() (string, error) { return "shared", nil }
func (e *eventLinks) Link(name string) (LinkInfo, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if l, ok := e.links[name]; ok {
		return l, nil
	}
	return LinkInfo{}, ErrLinkNotFound
}
func (e *eventLinks) Subscribe(_ context.Context, ch chan<- LinkInfo, _ func(error)) error {
	e.mu.Lock()
	e.events = ch
	e.mu.Unlock()
	close(e.ready)
	return nil
}

// set changes a link's state and announces it like a netlink event.
func (e *eventLinks) set(l LinkInfo) {
	e.mu.Lock()
	e.links[l.Name] = l
	ch := e.events
	e.mu.Unlock()
	ch <- l
}

func startWatcher(t *testing.T, root string, links Links, interval time.Duration) <-chan observation {
	t.Helper()
	devs, err := Discover(context.Background(), DiscoverOptions{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	obs := make(chan observation, 100)
	w, err := NewWatcher(WatcherOptions{Root: root, Devices: devs, Links: links, Interval: interval,
		Observe: func(id string, healthy bool, reason string) { obs <- observation{id, healthy, reason} }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return obs
}

func next(t *testing.T, obs <-chan observation) observation {
	t.Helper()
	select {
	case o := <-obs:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no observation within 10s")
		return observation{}
	}
}

func TestWatcherPortState(t *testing.T) {
	root := t.TempDir()
	if err := fakesys.Write(root, fixtures["portdown"]); err != nil {
		t.Fatal(err)
	}
	obs := startWatcher(t, root, nil, 5*time.Millisecond)

	initial := map[string]observation{}
	for range 2 {
		o := next(t, obs)
		initial[o.id] = o
	}
	if o := initial["mlx5_0"]; !o.healthy {
		t.Errorf("initial mlx5_0 = %+v, want healthy", o)
	}
	if o := initial["mlx5_1"]; o.healthy || o.reason != "port 1 state is DOWN" {
		t.Errorf("initial mlx5_1 = %+v, want unhealthy with 'port 1 state is DOWN'", o)
	}

	steps := []struct {
		name   string
		change func() error
		want   observation
	}{
		{"port goes down", func() error { return fakesys.SetPortState(root, "mlx5_0", 1, false) },
			observation{"mlx5_0", false, "port 1 state is DOWN"}},
		{"port comes back", func() error { return fakesys.SetPortState(root, "mlx5_0", 1, true) },
			observation{"mlx5_0", true, ""}},
		{"netdev goes down (sysfs)", func() error { return fakesys.SetNetDevOperState(root, "ib0", "down") },
			observation{"mlx5_0", false, "netdev ib0 operstate is down"}},
		{"netdev comes back", func() error { return fakesys.SetNetDevOperState(root, "ib0", "up") },
			observation{"mlx5_0", true, ""}},
		{"other port recovers", func() error {
			if err := fakesys.SetNetDevOperState(root, "ib1", "up"); err != nil {
				return err
			}
			return fakesys.SetPortState(root, "mlx5_1", 1, true)
		}, observation{"mlx5_1", true, ""}},
	}
	for _, s := range steps {
		if err := s.change(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := next(t, obs); got != s.want {
			t.Errorf("%s: observed %+v, want %+v", s.name, got, s.want)
		}
	}
	select {
	case o := <-obs:
		t.Errorf("unexpected observation %+v (only changes are reported)", o)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestWatcherNetlinkEvents(t *testing.T) {
	links := &eventLinks{links: map[string]LinkInfo{"ib0": {Name: "ib0", OperState: "up", AdminUp: true, MTU: 4092}}, ready: make(chan struct{})}
	// A poll interval far longer than the test: only events can report.
	obs := startWatcher(t, fixtureRoot("ib"), links, time.Hour)
	if o := next(t, obs); o != (observation{"mlx5_0", true, ""}) {
		t.Fatalf("initial = %+v, want mlx5_0 healthy", o)
	}
	<-links.ready
	steps := []struct {
		link LinkInfo
		want observation
	}{
		{LinkInfo{Name: "ib0", OperState: "lower-layer-down", AdminUp: true}, observation{"mlx5_0", false, "netdev ib0 operstate is lower-layer-down"}},
		{LinkInfo{Name: "ib0", OperState: "up", AdminUp: true}, observation{"mlx5_0", true, ""}},
		{LinkInfo{Name: "ib0", OperState: "down", AdminUp: false}, observation{"mlx5_0", false, "netdev ib0 is administratively down (operstate down)"}},
		{LinkInfo{Name: "ib0", OperState: "unknown", AdminUp: true}, observation{"mlx5_0", true, ""}},
	}
	for _, s := range steps {
		links.set(s.link)
		if got := next(t, obs); got != s.want {
			t.Errorf("after %+v: observed %+v, want %+v", s.link, got, s.want)
		}
	}
}

func TestWatcherWithoutDevices(t *testing.T) {
	w, err := NewWatcher(WatcherOptions{Root: t.TempDir(), Observe: func(string, bool, string) {}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err != nil {
		t.Errorf("Run without devices = %v, want nil", err)
	}
	if _, err := NewWatcher(WatcherOptions{}); err == nil {
		t.Error("NewWatcher without Observe succeeded")
	}
}

// TestWatcherIgnoresVirtualNetDevs: a VLAN on a RoCE port (seen only in
// the GID table) being down does not make the port unhealthy; the port's
// own netdev does.
func TestWatcherIgnoresVirtualNetDevs(t *testing.T) {
	links := &eventLinks{links: map[string]LinkInfo{
		"vlan100":       {Name: "vlan100", OperState: "down"},
		"enp225s0f0np0": {Name: "enp225s0f0np0", OperState: "up", AdminUp: true},
	}, ready: make(chan struct{})}
	obs := startWatcher(t, fixtureRoot("roce"), links, time.Hour)
	if o := next(t, obs); o != (observation{"mlx5_4", true, ""}) {
		t.Fatalf("initial = %+v, want mlx5_4 healthy despite vlan100 down", o)
	}
	<-links.ready
	links.set(LinkInfo{Name: "enp225s0f0np0", OperState: "down", AdminUp: true})
	if o := next(t, obs); o != (observation{"mlx5_4", false, "netdev enp225s0f0np0 operstate is down"}) {
		t.Errorf("after the port netdev went down: %+v", o)
	}
}

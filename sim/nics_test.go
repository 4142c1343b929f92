package sim

import (
	"context"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func newSim(tb testing.TB, profile string) *Node {
	tb.Helper()
	spec, err := Profile(profile)
	if err != nil {
		tb.Fatal(err)
	}
	n, err := New(spec, tb.TempDir(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// TestSimNICsDiscoverable reads the simulated NICs back with package
// rdma's discovery and checks they match the spec, including each NIC's
// PCIe distance to every GPU (rdma.Distance against the profile's own).
func TestSimNICsDiscoverable(t *testing.T) {
	tests := []struct {
		profile string
		// nearest lists, per NIC, the GPUs on its PCIe switch.
		nearest map[string][]int
	}{
		{profile: "dgx-a100", nearest: map[string][]int{
			"mlx5_0": {0, 1}, "mlx5_1": {0, 1}, "mlx5_2": {2, 3}, "mlx5_3": {2, 3},
			"mlx5_4": {4, 5}, "mlx5_5": {4, 5}, "mlx5_6": {6, 7}, "mlx5_7": {6, 7},
		}},
		{profile: "dgx-h100", nearest: map[string][]int{
			"mlx5_0": {0}, "mlx5_1": {1}, "mlx5_2": {2}, "mlx5_3": {3},
			"mlx5_4": {4}, "mlx5_5": {5}, "mlx5_6": {6}, "mlx5_7": {7},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.profile, func(t *testing.T) {
			n := newSim(t, tt.profile)
			spec := n.Spec()
			devs, err := rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: n.HostRoot()})
			if err != nil {
				t.Fatal(err)
			}
			if len(devs) != len(spec.NICs) {
				t.Fatalf("discovered %d devices, spec has %d NICs", len(devs), len(spec.NICs))
			}
			got := rdma.ToTopology(devs, spec.GPUs)
			want := slices.Clone(spec.NICs)
			sort.Slice(want, func(i, j int) bool { return want[i].Name < want[j].Name })
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("discovered NICs differ from the spec (-spec +discovered):\n%s", diff)
			}
			for _, d := range devs {
				var single []int
				for _, l := range rdma.ToTopology([]rdma.Device{d}, spec.GPUs)[0].GPUs {
					if l.PCIe == topology.PCIeSingleSwitch {
						single = append(single, l.GPU)
					}
				}
				if !slices.Equal(single, tt.nearest[d.Name]) {
					t.Errorf("%s: GPUs on its switch = %v, want %v", d.Name, single, tt.nearest[d.Name])
				}
				p := d.Ports[0]
				i := slices.IndexFunc(want, func(n topology.NIC) bool { return n.Name == d.Name })
				ib := want[i].LinkLayer == rdma.LinkLayerInfiniBand
				if p.State != "ACTIVE" || p.PhysState != "LinkUp" || p.LinkLayer != want[i].LinkLayer {
					t.Errorf("%s port = %s/%s/%s, want ACTIVE/LinkUp/%s", d.Name, p.State, p.PhysState, p.LinkLayer, want[i].LinkLayer)
				}
				// issm exists on InfiniBand ports only (subnet management).
				if d.UVerbs == nil || p.UMAD == nil || (p.ISSM != nil) != ib || d.RDMACM == nil {
					t.Errorf("%s char devices: uverbs %v umad %v issm %v rdma_cm %v, want all (issm only on InfiniBand)", d.Name, d.UVerbs, p.UMAD, p.ISSM, d.RDMACM)
				}
				if d.PCI.Driver != "mlx5_core" || d.PCI.Vendor != "15b3" {
					t.Errorf("%s pci = %+v, want mlx5_core 15b3", d.Name, d.PCI)
				}
				if len(p.NetDevs) != 1 || p.NetDevs[0].OperState != "up" {
					t.Errorf("%s port netdevs = %+v, want one up", d.Name, p.NetDevs)
				}
			}
		})
	}
}

func TestSetPortState(t *testing.T) {
	n := newSim(t, "dgx-h100")
	port := func(name string) (rdma.Port, error) {
		devs, err := rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: n.HostRoot()})
		if err != nil {
			return rdma.Port{}, err
		}
		for _, d := range devs {
			if d.Name == name {
				return d.Ports[0], nil
			}
		}
		t.Fatalf("%s not discovered", name)
		return rdma.Port{}, nil
	}
	tests := []struct {
		name      string
		nic       string
		up        bool
		wantErr   string
		wantState string
		wantOper  string
	}{
		{name: "down", nic: "mlx5_3", up: false, wantState: "DOWN/Polling", wantOper: "down"},
		{name: "up again", nic: "mlx5_3", up: true, wantState: "ACTIVE/LinkUp", wantOper: "up"},
		{name: "explicit port", nic: "mlx5_3:1", up: false, wantState: "DOWN/Polling", wantOper: "down"},
		{name: "unknown nic", nic: "mlx5_42", wantErr: `nic "mlx5_42": no such nic`},
		{name: "bad port", nic: "mlx5_3:x", wantErr: `nic "mlx5_3:x": bad port "x"`},
		{name: "missing port", nic: "mlx5_3:2", wantErr: "mlx5_3 port 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := n.setPortState(tt.nic, tt.up)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("setPortState error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p, err := port(strings.Split(tt.nic, ":")[0])
			if err != nil {
				t.Fatal(err)
			}
			if got := p.State + "/" + p.PhysState; got != tt.wantState {
				t.Errorf("port state = %s, want %s", got, tt.wantState)
			}
			if got := p.NetDevs[0].OperState; got != tt.wantOper {
				t.Errorf("netdev operstate = %s, want %s", got, tt.wantOper)
			}
		})
	}
}

// TestSimRoCEStorageNICs: the dgx-a100 profile's storage NIC (one
// dual-port RoCE ConnectX on a CPU root port of socket 1, one PCI function
// per port) comes out as Ethernet ports whose netdev backs the RoCE GIDs,
// without issm, at the right distance from the GPUs, and the profile's
// model agrees with what discovery finds in the simulated sysfs.
func TestSimRoCEStorageNICs(t *testing.T) {
	spec, err := Profile("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.NICs) != 10 || spec.NICs[8].Name != "mlx5_8" || spec.NICs[9].Name != "mlx5_9" {
		t.Fatalf("dgx-a100 NICs %v, want mlx5_0..mlx5_9", spec.NICs)
	}
	n, err := New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: n.HostRoot()})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 10 {
		t.Fatalf("discovered %d devices, want 10", len(devs))
	}
	nics := rdma.ToTopology(devs, spec.GPUs)
	for i, d := range devs[8:] {
		p := d.Ports[0]
		want := []string{"enp193s0f0np0", "enp193s0f1np1"}[i]
		if p.LinkLayer != rdma.LinkLayerEthernet || p.ISSM != nil || p.UMAD == nil {
			t.Errorf("%s: link layer %s issm %v umad %v, want Ethernet, no issm, umad", d.Name, p.LinkLayer, p.ISSM, p.UMAD)
		}
		if len(p.NetDevs) != 1 || p.NetDevs[0].Name != want || p.NetDevs[0].MTU != 9000 {
			t.Errorf("%s: port netdevs %+v, want %s with MTU 9000", d.Name, p.NetDevs, want)
		}
		for _, l := range nics[8+i].GPUs {
			wantLevel := topology.PCIeCrossCPU
			if l.GPU >= 4 {
				wantLevel = topology.PCIeSameCPU
			}
			if l.PCIe != wantLevel {
				t.Errorf("%s to gpu %d: %s, want %s", d.Name, l.GPU, l.PCIe, wantLevel)
			}
		}
	}
	for i := range nics {
		if !slices.Equal(nics[i].GPUs, spec.NICs[i].GPUs) {
			t.Errorf("%s: discovered GPU distances %v, profile says %v", nics[i].Name, nics[i].GPUs, spec.NICs[i].GPUs)
		}
	}
	if got := rdma.Distance(devs[8].PCI.Path, 1, devs[9].PCI.Path, 1); got != topology.PCIeSameBoard {
		t.Errorf("the two storage ports: %s, want same-board", got)
	}
}

// portHealth is a minimal health view fed by the watcher, standing in for
// the health monitor.
type portHealth struct {
	mu sync.Mutex
	m  map[string]bool
}

func (p *portHealth) Healthy(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.m[id]
	return !ok || v
}

// TestPortDownReachesResourceDevices runs the chain the agent wires: a
// simulated port goes down, the Watcher reports it, and the rdma/ib
// resource's device list (what ListAndWatch sends) shows it unhealthy,
// then healthy again.
func TestPortDownReachesResourceDevices(t *testing.T) {
	n := newSim(t, "dgx-a100")
	devs, err := rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: n.HostRoot(), HostDevPrefix: n.HostRoot()})
	if err != nil {
		t.Fatal(err)
	}
	health := &portHealth{m: map[string]bool{}}
	changed := make(chan struct{}, 1)
	res, err := rdma.Resources(devs, []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}}, health, false)
	if err != nil {
		t.Fatal(err)
	}
	w, err := rdma.NewWatcher(rdma.WatcherOptions{Root: n.HostRoot(), Devices: devs, Interval: 10 * time.Millisecond,
		Observe: func(id string, healthy bool, _ string) {
			health.mu.Lock()
			health.m[id] = healthy
			health.mu.Unlock()
			select {
			case changed <- struct{}{}:
			default: // a wake-up is already pending
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	unhealthy := func() []string {
		var out []string
		for _, d := range res[0].Devices() {
			if !d.Healthy {
				out = append(out, d.ID)
			}
		}
		return out
	}
	waitFor := func(want []string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !slices.Equal(unhealthy(), want) {
			select {
			case <-changed:
			case <-deadline:
				t.Fatalf("unhealthy devices = %v, want %v", unhealthy(), want)
			}
		}
	}
	waitFor(nil)
	if len(res[0].Devices()) != 8 {
		t.Fatalf("rdma/ib has %d devices, want 8", len(res[0].Devices()))
	}
	if err := n.setPortState("mlx5_5", false); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"mlx5_5"})
	if err := n.setPortState("mlx5_5", true); err != nil {
		t.Fatal(err)
	}
	waitFor(nil)
	// The allocation points at the simulator's device nodes.
	resp, err := res[0].Allocate(ctx, []string{"mlx5_5"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.Devices[0].HostPath, filepath.Join(n.HostRoot(), "dev/infiniband/uverbs5"); got != want {
		t.Errorf("host path %s, want %s", got, want)
	}
}

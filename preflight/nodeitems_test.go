package preflight

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// node4 is a node NVML lists four GPUs of.
func node4() *topology.Node {
	n := &topology.Node{Host: topology.Host{DriverVersion: "570.172.08"}}
	for i, b := range []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"} {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: "GPU-" + string(rune('a'+i)), PCIBusID: b, Model: "NVIDIA H100 80GB HBM3"})
	}
	return n
}

var bus4 = []string{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"}

func TestGPUCount(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		in     Inputs
		status Status
		detail string
	}{
		{name: "bus and NVML agree", in: Inputs{Node: node4(), BusGPUs: bus4}, status: Pass, detail: "4 GPUs on the PCI bus, 4 in NVML"},
		{name: "as expected", cfg: Config{GPUCount: GPUCountConfig{Expected: 4}}, in: Inputs{Node: node4(), BusGPUs: bus4},
			status: Pass, detail: "4 GPUs on the PCI bus, 4 in NVML, 4 expected (preflight.gpuCount.expected)"},
		{name: "one missing from NVML", in: Inputs{Node: &topology.Node{GPUs: node4().GPUs[:3]}, BusGPUs: bus4},
			status: Fail, detail: "4 GPUs on the PCI bus, 3 in NVML: on the PCI bus but not in NVML: 0000:5d:00.0"},
		{name: "one off the bus", cfg: Config{GPUCount: GPUCountConfig{Expected: 8}}, in: Inputs{Node: node4(), BusGPUs: bus4},
			status: Fail, detail: "4 GPUs on the PCI bus, 4 in NVML, 8 expected (preflight.gpuCount.expected): not the expected count"},
		{name: "the label's count wins", cfg: Config{GPUCount: GPUCountConfig{Expected: 4, Label: "example.com/gpus"}},
			in: Inputs{Node: node4(), BusGPUs: bus4, ExpectedGPUs: 8}, status: Fail, detail: "8 expected (label example.com/gpus)"},
		{name: "NVML unavailable", in: Inputs{NodeErr: nvmlowner.ErrUnavailable, BusGPUs: bus4},
			status: Fail, detail: "4 GPUs on the PCI bus, 0 in NVML: NVML unavailable"},
		{name: "discovery failed", in: Inputs{NodeErr: errors.New("discover: nvml device count: ERROR_UNKNOWN"), BusGPUs: bus4},
			status: Fail, detail: "0 in NVML: NVML unavailable: discover: nvml device count: ERROR_UNKNOWN"},
		{name: "no sysfs", in: Inputs{Node: node4()}, status: Fail, detail: "the PCI bus shows no NVIDIA GPU"},
		{name: "bus unreadable", in: Inputs{Node: node4(), BusErr: errors.New("pci devices: permission denied")},
			status: Fail, detail: "the PCI bus could not be read: pci devices: permission denied"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := checkGPUCount(tc.cfg.WithDefaults(), &tc.in)
			if r.Item != ItemGPUCount || r.Target != "node" || r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s %s %s %q, want %s containing %q", r.Item, r.Target, r.Status, r.Detail, tc.status, tc.detail)
			}
		})
	}
}

func TestDriverVersion(t *testing.T) {
	withDriver := func(v string) *topology.Node { n := node4(); n.Host.DriverVersion = v; return n }
	tests := []struct {
		name, min string
		node      *topology.Node
		status    Status
		detail    string
	}{
		{name: "newer", min: "550.54.15", node: withDriver("570.172.08"), status: Pass, detail: "driver 570.172.08, at least 550.54.15"},
		{name: "same", min: "550.54.15", node: withDriver("550.54.15"), status: Pass},
		{name: "older branch", min: "550.54.15", node: withDriver("535.183.01"), status: Fail, detail: "driver 535.183.01, want at least 550.54.15"},
		{name: "older in the branch", min: "550.54.15", node: withDriver("550.54.14"), status: Fail, detail: "driver 550.54.14, want at least 550.54.15"},
		{name: "numbers, not strings", min: "550.9", node: withDriver("550.54.15"), status: Pass},
		{name: "shorter minimum", min: "570", node: withDriver("570.172.08"), status: Pass},
		{name: "no minimum", node: withDriver("570.172.08"), status: Skipped, detail: "driver 570.172.08; no minimum configured"},
		{name: "unreadable version", min: "550.54.15", node: withDriver(""), status: Fail, detail: "driver version unknown"},
		{name: "NVML unavailable", min: "550.54.15", status: Fail, detail: "NVML unavailable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Driver: DriverConfig{MinVersion: tc.min}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			r := checkDriver(cfg, &Inputs{Node: tc.node})
			if r.Status != tc.status || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("%s %q, want %s containing %q", r.Status, r.Detail, tc.status, tc.detail)
			}
		})
	}
}

// ibPort is an InfiniBand port as rdma.Discover reads it.
func ibPort(state, phys string, gbps uint64) rdma.Port {
	return rdma.Port{Number: 1, State: state, PhysState: phys, LinkLayer: rdma.LinkLayerInfiniBand, Rate: gbps * 1e9 / 8,
		NetDevs: []rdma.NetDev{{Name: "ib0", OperState: "up", AdminUp: true}}}
}

func hca(name string, p rdma.Port) rdma.Device {
	return rdma.Device{Name: name, PCI: rdma.PCIFunction{Vendor: "15b3"}, Ports: []rdma.Port{p}}
}

func TestRDMAPorts(t *testing.T) {
	ib := []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}}
	down := ibPort("DOWN", "Polling", 400)
	netdevDown := ibPort("ACTIVE", "LinkUp", 400)
	netdevDown.NetDevs[0].OperState = "down"
	tests := []struct {
		name    string
		cfg     Config
		in      Inputs
		want    []Status
		details []string
	}{
		{name: "all up at the same rate", in: Inputs{RDMAResources: ib, RDMADevices: []rdma.Device{hca("mlx5_0", ibPort("ACTIVE", "LinkUp", 400)), hca("mlx5_1", ibPort("ACTIVE", "LinkUp", 400))}},
			want: []Status{Pass, Pass}, details: []string{"ACTIVE/LinkUp at 400 Gb/s", "ACTIVE/LinkUp at 400 Gb/s"}},
		{name: "one slower than its peers", in: Inputs{RDMAResources: ib, RDMADevices: []rdma.Device{hca("mlx5_0", ibPort("ACTIVE", "LinkUp", 400)), hca("mlx5_1", ibPort("ACTIVE", "LinkUp", 200))}},
			want: []Status{Pass, Fail}, details: []string{"400 Gb/s", "ACTIVE/LinkUp at 200 Gb/s: rate below 400 Gb/s (the resource's fastest port)"}},
		{name: "below the configured rate", cfg: Config{RDMA: RDMAConfig{MinRateGbps: 400}}, in: Inputs{RDMAResources: ib, RDMADevices: []rdma.Device{hca("mlx5_0", ibPort("ACTIVE", "LinkUp", 200))}},
			want: []Status{Fail}, details: []string{"rate below 400 Gb/s (preflight.rdma.minRateGbps)"}},
		{name: "port down", in: Inputs{RDMAResources: ib, RDMADevices: []rdma.Device{hca("mlx5_0", down)}},
			want: []Status{Fail}, details: []string{"DOWN/Polling at 400 Gb/s: port 1 state is DOWN, want ACTIVE/LinkUp"}},
		{name: "interface down", in: Inputs{RDMAResources: ib, RDMADevices: []rdma.Device{hca("mlx5_0", netdevDown)}},
			want: []Status{Fail}, details: []string{"interface ib0 is down, want up"}},
		{name: "a resource without ports", in: Inputs{RDMAResources: ib},
			want: []Status{Fail}, details: []string{"selects no port"}},
		{name: "no resource", in: Inputs{}, want: []Status{Skipped}, details: []string{"no RDMA resource configured"}},
		{name: "discovery failed", in: Inputs{RDMAResources: ib, RDMAErr: rdma.ErrExclusiveNetns}, want: []Status{Fail}, details: []string{"RDMA devices not discovered"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs := checkRDMA(tc.cfg.WithDefaults(), &tc.in)
			if len(rs) != len(tc.want) {
				t.Fatalf("%d results %+v, want %d", len(rs), rs, len(tc.want))
			}
			for i, r := range rs {
				if r.Item != ItemRDMA || r.Status != tc.want[i] || !strings.Contains(r.Detail, tc.details[i]) {
					t.Errorf("result %d: %s %s %q, want %s containing %q", i, r.Target, r.Status, r.Detail, tc.want[i], tc.details[i])
				}
			}
		})
	}
}

type fakeDiag struct {
	res   []health.DCGMDiagResult
	err   error
	level int
}

func (f *fakeDiag) RunDiag(ctx context.Context, level int) ([]health.DCGMDiagResult, error) {
	f.level = level
	if f.err != nil {
		return nil, f.err
	}
	return f.res, ctx.Err()
}

func TestDCGMDiag(t *testing.T) {
	gpus := map[string]gpu{"GPU-3": h100}
	passing := []health.DCGMDiagResult{
		{Test: "software", Status: "pass"}, {Test: "pcie", GPU: "GPU-3", Status: "pass"},
		{Test: "memory", GPU: "GPU-3", Status: "warn", Message: "slow"}, {Test: "eud", GPU: "GPU-3", Status: "skipped"},
	}
	tests := []struct {
		name    string
		diag    *fakeDiag
		dcgmErr error
		want    []Status
		targets []string
		details []string
	}{
		{name: "passes", diag: &fakeDiag{res: passing}, want: []Status{Pass}, targets: []string{"node"},
			details: []string{"level 1: 3 results passed, 1 skipped or not run; warnings from memory"}},
		{name: "a GPU fails", diag: &fakeDiag{res: append(passing, health.DCGMDiagResult{Test: "pcie", GPU: "GPU-3", Status: "fail", Message: "PCIe replay rate exceeded (DCGM error 28)"})},
			want: []Status{Fail}, targets: []string{"GPU 3 (0000:1b:00.0)"}, details: []string{`level 1 test "pcie" failed: PCIe replay rate exceeded`}},
		{name: "software fails", diag: &fakeDiag{res: []health.DCGMDiagResult{{Test: "software", Status: "fail", Message: "persistence mode disabled"}}},
			want: []Status{Fail}, targets: []string{"node"}, details: []string{"persistence mode disabled"}},
		{name: "does not run", diag: &fakeDiag{err: errors.New("DCGM_ST_NOT_SUPPORTED")}, want: []Status{Fail}, targets: []string{"node"},
			details: []string{"level 1 did not run: DCGM_ST_NOT_SUPPORTED"}},
		{name: "no DCGM", dcgmErr: errors.New("dcgm init: libdcgm.so.4: cannot open shared object file"), want: []Status{Skipped}, targets: []string{"node"},
			details: []string{"no DCGM (dcgm init: libdcgm.so.4"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := Inputs{DCGMErr: tc.dcgmErr}
			if tc.diag != nil {
				in.DCGM = tc.diag
			}
			rs := checkDCGM(context.Background(), Config{}.WithDefaults(), &in, gpus)
			if len(rs) != len(tc.want) {
				t.Fatalf("%d results %+v, want %d", len(rs), rs, len(tc.want))
			}
			for i, r := range rs {
				if r.Item != ItemDCGM || r.Status != tc.want[i] || r.Target != tc.targets[i] || !strings.Contains(r.Detail, tc.details[i]) {
					t.Errorf("result %d: %s %s %q, want %s %s containing %q", i, r.Target, r.Status, r.Detail, tc.targets[i], tc.want[i], tc.details[i])
				}
			}
			if tc.diag != nil && tc.diag.level != DefaultDCGMLevel {
				t.Errorf("ran level %d, want %d", tc.diag.level, DefaultDCGMLevel)
			}
		})
	}
}

package preflight

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// simNode is a simulated node and its NVML owner.
type simNode struct {
	sim   *sim.Node
	owner *nvmlowner.Owner
}

func newSimNode(t *testing.T, profile string, callTimeout time.Duration) *simNode {
	t.Helper()
	spec, err := sim.Profile(profile)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sim.New(spec, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := nvmlowner.New(n.NVML(), nvmlowner.Config{CallTimeout: callTimeout}, nil)
	if err := o.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Shutdown(context.Background()) })
	return &simNode{sim: n, owner: o}
}

func (s *simNode) fault(t *testing.T, method, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	s.sim.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, "/faults", strings.NewReader(body)))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("%s /faults %s: %d %s", method, body, rec.Code, rec.Body.String())
	}
}

var ibResource = []rdma.ResourceConfig{{Name: "ib", Selectors: rdma.Selectors{LinkTypes: []string{"infiniband"}}}}

// inputs gathers what the agent's wiring and the subcommand give a
// preflight: a discovery now, the PCI bus, the RDMA devices.
func (s *simNode) inputs(t *testing.T) Inputs {
	t.Helper()
	root := s.sim.HostRoot()
	in := Inputs{Owner: s.owner, RDMAResources: ibResource}
	in.Node, in.NodeErr = nvmlowner.NewDiscoverer(s.owner, root, nil).Discover(context.Background(), nil)
	in.BusGPUs, in.BusErr = health.GPUsOnPCI(root)
	in.RDMADevices, in.RDMAErr = rdma.Discover(context.Background(), rdma.DiscoverOptions{Root: root, HostDevPrefix: root})
	return in
}

// TestRunHealthyDGXH100: every item that has something to judge passes on
// a simulated DGX H100.
func TestRunHealthyDGXH100(t *testing.T) {
	s := newSimNode(t, "dgx-h100", 5*time.Second)
	cfg := Config{GPUCount: GPUCountConfig{Expected: 8}, Driver: DriverConfig{MinVersion: "550.54.15"},
		Command: CommandConfig{Args: []string{"/bin/sh", "-c", `test -n "$GNA_PREFLIGHT_GPUS"`}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	rep := New(cfg, nil).Run(context.Background(), s.inputs(t))
	if !rep.Passed() {
		t.Fatalf("failed: %s", rep.Summary(0))
	}
	want := map[string]Status{
		ItemGPUCount: Pass, ItemDriverVersion: Pass, ItemPersistence: Pass, ItemECC: Pass,
		ItemRetiredPages: Skipped, // Hopper remaps rows
		ItemRowRemap:     Pass, ItemPCIe: Pass, ItemNVLink: Pass, ItemFabric: Pass, ItemThrottle: Pass,
		ItemRDMA: Pass, ItemDCGM: Skipped, ItemCommand: Pass,
	}
	for _, item := range Items {
		if got := rep.ItemStatus(item); got != want[item] {
			t.Errorf("%s: %s, want %s", item, got, want[item])
		}
	}
	counts := map[string]int{}
	for _, r := range rep.Results {
		counts[r.Item]++
	}
	if counts[ItemPCIe] != 8 || counts[ItemRDMA] != 8 || counts[ItemGPUCount] != 1 {
		t.Errorf("results per item: %v (want 8 GPUs, 8 ports, one node)", counts)
	}
	if got := rep.Summary(0); got != "preflight passed (11 items passed, 2 skipped)" {
		t.Errorf("summary %q", got)
	}
}

// TestRunFaults: a fault injected into the simulated DGX H100 fails its
// item on the faulty GPU or port, naming it, and nothing else.
func TestRunFaults(t *testing.T) {
	tests := []struct {
		name   string
		faults []string
		item   string
		target string
		detail string
	}{
		{name: "degraded PCIe link", faults: []string{`{"kind":"pcie-degraded","gpu":3}`}, item: ItemPCIe,
			target: "GPU 3 (0000:33:00.0)", detail: "PCIe link gen 4 x8, max gen 5 x16: width below its maximum"},
		{name: "PCIe generation", faults: []string{`{"kind":"pcie-degraded","gpu":0,"pcieGen":3}`}, item: ItemPCIe,
			target: "GPU 0", detail: "PCIe link gen 3 x16, max gen 5 x16: generation below its maximum"},
		{name: "ECC disabled", faults: []string{`{"kind":"ecc-disabled","gpu":1}`}, item: ItemECC, target: "GPU 1", detail: "ECC disabled (pending disabled), want enabled"},
		{name: "persistence off", faults: []string{`{"kind":"persistence-disabled","gpu":2}`}, item: ItemPersistence, target: "GPU 2", detail: "persistence mode disabled"},
		{name: "old driver", faults: []string{`{"kind":"old-driver"}`}, item: ItemDriverVersion, target: "node",
			detail: "driver 525.147.05, want at least 550.54.15"},
		{name: "throttled", faults: []string{`{"kind":"throttle","gpu":4,"reason":"hw-power-brake-slowdown"}`}, item: ItemThrottle,
			target: "GPU 4", detail: "clocks held down by hw-power-brake-slowdown"},
		{name: "row remap pending", faults: []string{`{"kind":"row-remap-pending","gpu":5}`}, item: ItemRowRemap, target: "GPU 5", detail: "a row remap is pending"},
		{name: "nvlink down", faults: []string{`{"kind":"nvlink-down","gpu":6,"link":9}`}, item: ItemNVLink, target: "GPU 6", detail: "NVLink 9 down; 17 of 18 expected up"},
		{name: "fabric not ready", faults: []string{`{"kind":"fabric-not-ready","gpu":7}`}, item: ItemFabric, target: "GPU 7", detail: "registration in progress"},
		{name: "gpu missing from NVML", faults: []string{`{"kind":"gpu-missing","gpu":2}`}, item: ItemGPUCount, target: "node",
			detail: "8 GPUs on the PCI bus, 7 in NVML, 8 expected (preflight.gpuCount.expected): on the PCI bus but not in NVML: 0000:23:00.0; not the expected count"},
		{name: "port down", faults: []string{`{"kind":"port-down","nic":"mlx5_3"}`}, item: ItemRDMA, target: "rdma/ib mlx5_3", detail: "port 1 state is DOWN, want ACTIVE/LinkUp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSimNode(t, "dgx-h100", 5*time.Second)
			for _, f := range tc.faults {
				s.fault(t, http.MethodPost, f)
			}
			cfg := Config{GPUCount: GPUCountConfig{Expected: 8}, Driver: DriverConfig{MinVersion: "550.54.15"}}
			rep := New(cfg, nil).Run(context.Background(), s.inputs(t))
			failed := rep.Failed()
			if len(failed) != 1 {
				t.Fatalf("%d failures, want 1: %s", len(failed), rep.Summary(0))
			}
			r := failed[0]
			if r.Item != tc.item || !strings.HasPrefix(r.Target, tc.target) || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("failed %s %s %q, want %s %s containing %q", r.Item, r.Target, r.Detail, tc.item, tc.target, tc.detail)
			}
			if !strings.Contains(rep.Summary(0), tc.item+": "+r.Target) {
				t.Errorf("summary %q does not name the item and target", rep.Summary(0))
			}
		})
	}
}

// TestRunHungGPU: a GPU whose NVML calls hang fails its items as not
// answering; every other GPU is judged in full.
func TestRunHungGPU(t *testing.T) {
	s := newSimNode(t, "dgx-h100", 200*time.Millisecond)
	in := s.inputs(t)
	s.fault(t, http.MethodPost, `{"kind":"hang","gpu":5}`)
	defer s.fault(t, http.MethodDelete, `{"kind":"hang","gpu":5}`)
	rep := New(Config{}, nil).Run(context.Background(), in)
	hung := in.Node.GPUs[5].UUID
	for _, r := range rep.Results {
		if !strings.HasPrefix(r.Target, "GPU ") {
			continue
		}
		switch {
		case r.Device == hung && (r.Status != Fail || !strings.Contains(r.Detail, "GPU not answering (nvml-timeout)")):
			t.Errorf("hung GPU %s: %s %q", r.Item, r.Status, r.Detail)
		case r.Device != hung && r.Status == Fail:
			t.Errorf("%s %s failed beside the hung GPU: %q", r.Item, r.Target, r.Detail)
		}
	}
	if got := rep.FailedDevices(); len(got) != 1 || got[0] != hung {
		t.Errorf("failed devices %v, want [%s]", got, hung)
	}
}

func TestRunWithoutNVML(t *testing.T) {
	rep := New(Config{}, nil).Run(context.Background(), Inputs{NodeErr: nvmlowner.ErrUnavailable, BusGPUs: []string{"0000:18:00.0"}})
	if rep.Passed() || rep.ItemStatus(ItemGPUCount) != Fail || rep.ItemStatus(ItemPCIe) != Skipped {
		t.Errorf("without NVML: %s; pcie %s", rep.Summary(0), rep.ItemStatus(ItemPCIe))
	}
}

func TestRunDisabledItems(t *testing.T) {
	s := newSimNode(t, "dgx-h100", 5*time.Second)
	s.fault(t, http.MethodPost, `{"kind":"pcie-degraded","gpu":3}`)
	cfg := Config{DisabledItems: []string{ItemPCIe, ItemCommand}}
	rep := New(cfg, nil).Run(context.Background(), s.inputs(t))
	if !rep.Passed() {
		t.Errorf("pcie-link disabled, still failed: %s", rep.Summary(0))
	}
	for _, item := range []string{ItemPCIe, ItemCommand} {
		var rs []Result
		for _, r := range rep.Results {
			if r.Item == item {
				rs = append(rs, r)
			}
		}
		if len(rs) != 1 || rs[0].Status != Skipped || rs[0].Detail != "disabled (preflight.disabledItems)" {
			t.Errorf("%s: %+v", item, rs)
		}
	}
}

// TestRunBusy: with Inputs.Busy the items that load the GPUs (DCGM's
// diagnostic, the command) are skipped saying why; a disabled one still
// says disabled; the reading items run.
func TestRunBusy(t *testing.T) {
	s := newSimNode(t, "dgx-h100", 5*time.Second)
	in := s.inputs(t)
	in.Busy = "pods hold GPU 2"
	cfg := Config{DisabledItems: []string{ItemDCGM}, Command: CommandConfig{Args: []string{"false"}}}
	rep := New(cfg, nil).Run(context.Background(), in)
	if !rep.Passed() {
		t.Errorf("failed: %s", rep.Summary(0))
	}
	want := map[string]string{ItemDCGM: "disabled (preflight.disabledItems)", ItemCommand: "not run: pods hold GPU 2"}
	for _, r := range rep.Results {
		if d, ok := want[r.Item]; ok && (r.Status != Skipped || r.Detail != d) {
			t.Errorf("%s: %s %q; want skipped %q", r.Item, r.Status, r.Detail, d)
		}
	}
	if rep.ItemStatus(ItemPCIe) != Pass {
		t.Errorf("pcie-link %s on a busy node", rep.ItemStatus(ItemPCIe))
	}
}

// TestRunGPUs: a re-check reads only the GPUs asked for, with the per-GPU
// items.
func TestRunGPUs(t *testing.T) {
	s := newSimNode(t, "dgx-h100", 5*time.Second)
	in := s.inputs(t)
	s.fault(t, http.MethodPost, `{"kind":"ecc-disabled","gpu":2}`)
	s.fault(t, http.MethodPost, `{"kind":"throttle","gpu":6}`)
	uuids := []string{in.Node.GPUs[2].UUID, in.Node.GPUs[3].UUID}
	rep := New(Config{}, nil).RunGPUs(context.Background(), in, uuids)
	if len(rep.Results) != 2*len(GPUItems) {
		t.Errorf("%d results, want %d", len(rep.Results), 2*len(GPUItems))
	}
	if got := rep.FailedDevices(); len(got) != 1 || got[0] != uuids[0] {
		t.Errorf("failed devices %v, want GPU 2's; %s", got, rep.Summary(0))
	}
	for _, r := range rep.Results {
		if !slicesContains(GPUItems, r.Item) || (r.Device != uuids[0] && r.Device != uuids[1]) {
			t.Errorf("re-check result %s on %s", r.Item, r.Target)
		}
	}
}

func slicesContains(s []string, x string) bool {
	for _, e := range s {
		if e == x {
			return true
		}
	}
	return false
}

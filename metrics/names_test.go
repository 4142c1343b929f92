package metrics

import (
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// simProfileCollector builds simulated node profile (no MIG) and a
// collector with cfg on it, and renders two cycles.
func simProfileCollector(tb testing.TB, profile string, cfg Config) *prometheus.Registry {
	tb.Helper()
	spec, err := sim.Profile(profile)
	if err != nil {
		tb.Fatal(err)
	}
	node, err := sim.New(spec, tb.TempDir(), nil)
	if err != nil {
		tb.Fatalf("sim.New: %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	cfg.Hostname = "sim-node"
	c, err := NewCollector(newLibSampler(tb, node.NVML(), node.Spec(), patientTimeout), cfg, reg, discardLogger())
	if err != nil {
		tb.Fatal(err)
	}
	c.SetNode(node.Spec())
	collectNow(tb, c)
	collectNow(tb, c)
	return reg
}

// dcgmSeries gathers reg's DCGM_ families: series per family name.
func dcgmSeries(t *testing.T, reg prometheus.Gatherer) map[string][]*dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]*dto.Metric{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "DCGM_") {
			out[mf.GetName()] = mf.GetMetric()
		}
	}
	return out
}

func labelNames(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// TestDCGMNamesModes: legacy serves the old names only, current DCGM
// 4.6's only (and the driver version label under its 4.6 name), both
// serves each renamed field twice with the same value; every legacy
// series of mode legacy is served unchanged in mode both, so NVIDIA's
// dashboard and default counters see the same in both modes.
func TestDCGMNamesModes(t *testing.T) {
	legacy := dcgmSeries(t, simProfileCollector(t, "dgx-h100", Config{XIDs: fakeXIDs{}}))
	both := dcgmSeries(t, simProfileCollector(t, "dgx-h100", Config{XIDs: fakeXIDs{}, Names: DCGMNamesBoth}))
	current := dcgmSeries(t, simProfileCollector(t, "dgx-h100", Config{XIDs: fakeXIDs{}, Names: DCGMNamesCurrent}))

	for _, name := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_SM_CLOCK"} {
		if len(legacy[name]) != 8 {
			t.Errorf("legacy: %s has %d series, want 8", name, len(legacy[name]))
		}
	}
	for legacyName, currentName := range map[string]string{
		"DCGM_FI_DEV_GPU_TEMP":                "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
		"DCGM_FI_DEV_POWER_USAGE":             "DCGM_FI_DEV_BOARD_POWER_WATTS",
		"DCGM_FI_DEV_GPU_UTIL":                "DCGM_FI_DEV_GPU_UTIL_RATIO",
		"DCGM_FI_DEV_XID_ERRORS":              "DCGM_FI_DEV_XID_ERROR",
		"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":  "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
		"DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
	} {
		if _, ok := legacy[currentName]; ok {
			t.Errorf("legacy serves %s", currentName)
		}
		if _, ok := current[legacyName]; ok {
			t.Errorf("current serves %s", legacyName)
		}
		if len(current[currentName]) != 8 || len(both[currentName]) != 8 || len(both[legacyName]) != 8 {
			t.Errorf("%s/%s: current %d, both %d/%d series, want 8", legacyName, currentName,
				len(current[currentName]), len(both[legacyName]), len(both[currentName]))
			continue
		}
		if l, c := both[legacyName][0], both[currentName][0]; l.String() != c.String() {
			t.Errorf("both: %s = %v, %s = %v: not the same reading", legacyName, l, currentName, c)
		}
	}
	for name, series := range legacy {
		if got := both[name]; len(got) != len(series) {
			t.Errorf("both: %s has %d series, legacy %d", name, len(got), len(series))
		}
	}
	if l := labelNames(current["DCGM_FI_DEV_SM_CLOCK"][0]); l[labelDriverVersionCurrent] == "" || l[labelDriverVersion] != "" {
		t.Errorf("current: driver version labels %v, want %s only", l, labelDriverVersionCurrent)
	}
	if l := labelNames(both["DCGM_FI_DEV_GPU_TEMP_CELSIUS"][0]); l[labelDriverVersion] == "" {
		t.Errorf("both: driver version labels %v, want %s", l, labelDriverVersion)
	}
}

func TestParseDCGMNames(t *testing.T) {
	for in, want := range map[string]DCGMNames{"": DCGMNamesLegacy, "legacy": DCGMNamesLegacy, "both": DCGMNamesBoth, "current": DCGMNamesCurrent} {
		if got, err := ParseDCGMNames(in); err != nil || got != want {
			t.Errorf("ParseDCGMNames(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := ParseDCGMNames("new")
	if err == nil || !strings.Contains(err.Error(), "metrics.dcgmNames") {
		t.Errorf("ParseDCGMNames(new) = %v, want an error naming metrics.dcgmNames", err)
	}
	if _, err := NewCollector(nil, Config{Names: "Legacy"}, prometheus.NewRegistry(), nil); err == nil {
		t.Error("NewCollector accepted metrics.dcgmNames Legacy")
	}
}

// TestNVLink5Fields: a simulated B200 (NVLink5) answers the NVLink error,
// BER and FEC history fields, summed (or the worst link's) over its 18
// links; an H100 (NVLink4) answers NOT_SUPPORTED for them and has no such
// series, never a zero.
func TestNVLink5Fields(t *testing.T) {
	names := []string{
		"DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", "DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER_FLOAT",
		"DCGM_FI_DEV_NVLINK_COUNT_RX_SYMBOL_ERRORS", "DCGM_FI_DEV_NVLINK_COUNT_SYMBOL_BER_FLOAT",
		"DCGM_FI_DEV_NVLINK_COUNT_FEC_HISTORY_0", "DCGM_FI_DEV_NVLINK_COUNT_FEC_HISTORY_15",
	}
	b200 := dcgmSeries(t, simProfileCollector(t, "dgx-b200", Config{}))
	h100 := dcgmSeries(t, simProfileCollector(t, "dgx-h100", Config{}))
	for _, name := range names {
		if len(b200[name]) != 8 {
			t.Errorf("dgx-b200: %s has %d series, want 8", name, len(b200[name]))
		}
		if len(h100[name]) != 0 {
			t.Errorf("dgx-h100: %s has %d series, want none (NVLink4)", name, len(h100[name]))
		}
	}
}

func TestDecodeBER(t *testing.T) {
	for raw, want := range map[uint64]float64{0: 0, 3<<8 | 12: 3e-12, 15 << 8: 15, 0xf0000 | 1<<8 | 9: 1e-9} {
		if got := decodeBER(raw); math.Abs(got-want) > want*1e-12 {
			t.Errorf("decodeBER(%#x) = %g, want %g", raw, got, want)
		}
	}
}

// TestSeriesPerGPU counts the DCGM_ series per GPU of a simulated DGX
// H100 and DGX B200 (no MIG, no XID source) in each naming mode; the
// figures are in docs/metrics.md.
func TestSeriesPerGPU(t *testing.T) {
	want := map[string]map[DCGMNames]int{
		// 24 before the recovery action. Both: +10 second names (GPU and
		// memory temperature, power, PCIe replays, utilisation, NVLink
		// bandwidth, three row-remap fields, the recovery action).
		"dgx-h100": {DCGMNamesLegacy: 25, DCGMNamesBoth: 35, DCGMNamesCurrent: 25},
		// 24 before the recovery action and the 20 NVLink5 fields. Both:
		// +30 second names (the H100's 10 and the 20 NVLink5 fields).
		"dgx-b200": {DCGMNamesLegacy: 45, DCGMNamesBoth: 75, DCGMNamesCurrent: 45},
	}
	for profile, modes := range want {
		for mode, n := range modes {
			series := 0
			for _, s := range dcgmSeries(t, simProfileCollector(t, profile, Config{Names: mode})) {
				series += len(s)
			}
			t.Logf("%s %s: %d DCGM_ series per GPU", profile, mode, series/8)
			if series%8 != 0 || series/8 != n {
				t.Errorf("%s %s: %d series over 8 GPUs, want %d per GPU", profile, mode, series, n)
			}
		}
	}
}

// TestDRAClaimLabels: with DRALabels, the series of a device a DRA claim
// of ours holds carry the claim, driver, pool and device; a device-plugin
// GPU and a free GPU carry them empty; without DRALabels the label set is
// dcgm-exporter's default one.
func TestDRAClaimLabels(t *testing.T) {
	mn := newMockNode(t, 3, nil)
	const pool = "node-1"
	pods := &draPods{fakePods: newFakePods(), pool: pool, mn: mn}
	c, reg := newTestCollector(t, mn, Config{Pods: pods, DRALabels: true})
	pods.setDRA(
		&podresourcesv1.PodResources{Name: "train-0", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{{
			Name: "trainer",
			DynamicResources: []*podresourcesv1.DynamicResource{{ClaimName: "train-0-gpus", ClaimNamespace: "ml",
				ClaimResources: []*podresourcesv1.ClaimResource{{DriverName: dra.DriverName, PoolName: pool, DeviceName: dra.GPUName(0)}}}},
		}}},
		&podresourcesv1.PodResources{Name: "dp", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
			container("main", "nvidia.com/gpu", mn.node.GPUs[1].UUID)}},
	)
	collectNow(t, c)
	fb := dcgmSeries(t, reg)["DCGM_FI_DEV_FB_USED"]
	if len(fb) != 3 {
		t.Fatalf("FB_USED series = %d, want 3", len(fb))
	}
	want := map[string][5]string{
		mn.node.GPUs[0].UUID: {"train-0-gpus", "ml", dra.DriverName, pool, "gpu-0"},
		mn.node.GPUs[1].UUID: {},
		mn.node.GPUs[2].UUID: {},
	}
	for _, m := range fb {
		l := labelNames(m)
		got := [5]string{l[labelDRAClaimName], l[labelDRAClaimNamespace], l[labelDRADriverName], l[labelDRAPoolName], l[labelDRADeviceName]}
		if got != want[l[labelUUID]] {
			t.Errorf("%s: DRA labels %v, want %v", l[labelUUID], got, want[l[labelUUID]])
		}
		if l[labelUUID] == mn.node.GPUs[0].UUID && l[labelPod] != "train-0" {
			t.Errorf("DRA GPU pod label %q, want train-0", l[labelPod])
		}
	}

	plain, plainReg := newTestCollector(t, mn, Config{Pods: pods})
	collectNow(t, plain)
	for _, m := range dcgmSeries(t, plainReg)["DCGM_FI_DEV_FB_USED"] {
		if n := len(m.GetLabel()); n != numPlainLabels {
			t.Errorf("without DRALabels: %d labels, want %d", n, numPlainLabels)
		}
	}
}

// draPods is fakePods whose answers count our DRA driver's devices in pool.
type draPods struct {
	*fakePods
	pool string
	mn   *mockNode
}

func (d *draPods) setDRA(pods ...*podresourcesv1.PodResources) {
	d.mu.Lock()
	d.a = usage.NewDRAAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: pods}, nil, d.pool, d.mn.node)
	d.mu.Unlock()
	select {
	case d.ch <- struct{}{}:
	default:
	}
}

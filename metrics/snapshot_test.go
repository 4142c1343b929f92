package metrics

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Hand-built snapshots: rendering tests that need no NVML at all.

var (
	snapGPU0 = "GPU-00000000-0000-0000-0000-00000000000a"
	snapGPU1 = "GPU-00000000-0000-0000-0000-00000000000b"
	snapMIG  = "MIG-00000000-0000-0000-0001-000000000000"
)

// snapNode is a two-GPU node; GPU 1 has one 1g.10gb MIG device.
func snapNode() *topology.Node {
	return &topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: snapGPU0, PCIBusID: "0000:0a:00.0", Minor: 0, Model: "NVIDIA A100-SXM4-80GB"},
		{Index: 1, UUID: snapGPU1, PCIBusID: "0000:0b:00.0", Minor: 1, Model: "NVIDIA A100-SXM4-80GB", MIGEnabled: true,
			MIG: []topology.MIGDevice{{UUID: snapMIG, Profile: "1g.10gb", GPUInstance: 9, Index: 0}}},
	}}
}

// okSample is a sample of uuid whose given fields read OK and whose other
// fields are Absent.
func okSample(uuid string, vals map[nvmlowner.Field]uint64) nvmlowner.Sample {
	s := nvmlowner.Sample{UUID: uuid}
	for f, v := range vals {
		s.Values[f] = nvmlowner.Value{V: v, Status: nvmlowner.OK}
	}
	return s
}

func noData(s nvmlowner.Sample, st nvmlowner.Status, fields ...nvmlowner.Field) nvmlowner.Sample {
	for _, f := range fields {
		s.Values[f] = nvmlowner.Value{Status: st}
	}
	return s
}

// newSnapCollector is a collector without a sampler, fed by refresh.
func newSnapCollector(t *testing.T, cfg Config, log *slog.Logger) (*Collector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if cfg.Hostname == "" {
		cfg.Hostname = "node-1"
	}
	c, err := NewCollector(nil, cfg, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	c.SetNode(snapNode())
	return c, reg
}

const snapLabels0 = `DCGM_FI_DRIVER_VERSION="",GPU_I_ID="",GPU_I_PROFILE="",Hostname="node-1",UUID="GPU-00000000-0000-0000-0000-00000000000a",container="",device="nvidia0",gpu="0",modelName="NVIDIA A100-SXM4-80GB",namespace="",pci_bus_id="00000000:0A:00.0",pod=""`
const snapLabels1 = `DCGM_FI_DRIVER_VERSION="",GPU_I_ID="",GPU_I_PROFILE="",Hostname="node-1",UUID="GPU-00000000-0000-0000-0000-00000000000b",container="",device="nvidia1",gpu="1",modelName="NVIDIA A100-SXM4-80GB",namespace="",pci_bus_id="00000000:0B:00.0",pod=""`
const snapLabelsMIG = `DCGM_FI_DRIVER_VERSION="",GPU_I_ID="9",GPU_I_PROFILE="1g.10gb",Hostname="node-1",UUID="GPU-00000000-0000-0000-0000-00000000000b",container="",device="nvidia1",gpu="1",modelName="NVIDIA A100-SXM4-80GB",namespace="",pci_bus_id="00000000:0B:00.0",pod=""`

func TestRenderSnapshot(t *testing.T) {
	lost := &nvmlowner.CallError{What: "sample", Err: nvml.ERROR_GPU_IS_LOST}
	tests := []struct {
		name    string
		cfg     Config
		samples []nvmlowner.Sample
		names   []string
		want    string
	}{
		{
			name: "units and MIG framebuffer",
			samples: []nvmlowner.Sample{
				okSample(snapGPU0, map[nvmlowner.Field]uint64{nvmlowner.FieldPowerUsage: 250125, nvmlowner.FieldFBUsed: 2*mib + 1}),
				func() nvmlowner.Sample {
					s := okSample(snapGPU1, map[nvmlowner.Field]uint64{nvmlowner.FieldFBUsed: 10 * mib})
					s.MIG = []nvmlowner.MIGSample{{UUID: snapMIG,
						FBUsed: nvmlowner.Value{V: 64 * mib, Status: nvmlowner.OK},
						FBFree: nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}}}
					return s
				}(),
			},
			names: []string{"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"},
			want: `# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
# TYPE DCGM_FI_DEV_FB_USED gauge
DCGM_FI_DEV_FB_USED{` + snapLabels0 + `} 2
DCGM_FI_DEV_FB_USED{` + snapLabels1 + `} 10
DCGM_FI_DEV_FB_USED{` + snapLabelsMIG + `} 64
# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{` + snapLabels0 + `} 250.125
`,
		},
		{
			name: "sample not in the node is skipped, GPU without a sample has no series",
			samples: []nvmlowner.Sample{
				okSample("GPU-ffffffff-0000-0000-0000-000000000000", map[nvmlowner.Field]uint64{nvmlowner.FieldGPUTemp: 90}),
				okSample(snapGPU1, map[nvmlowner.Field]uint64{nvmlowner.FieldGPUTemp: 41}),
			},
			names: []string{"DCGM_FI_DEV_GPU_TEMP"},
			want: `# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{` + snapLabels1 + `} 41
`,
		},
		{
			name: "lost GPU keeps only its XID",
			cfg:  Config{XIDs: fakeXIDs{snapGPU0: 79}},
			samples: []nvmlowner.Sample{
				{UUID: snapGPU0, Err: lost},
				okSample(snapGPU1, map[nvmlowner.Field]uint64{nvmlowner.FieldGPUTemp: 41}),
			},
			names: []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS"},
			want: `# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{` + snapLabels1 + `} 41
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{` + snapLabels0 + `} 79
DCGM_FI_DEV_XID_ERRORS{` + snapLabels1 + `} 0
`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, reg := newSnapCollector(t, tt.cfg, testLogger(t))
			c.refresh(context.Background(), &nvmlowner.Snapshot{Seq: 1, Samples: tt.samples})
			if err := testutil.GatherAndCompare(reg, strings.NewReader(tt.want), tt.names...); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestCollectionErrorsCountCycles: one error per sampling cycle in which a
// GPU failed, not per render; no data is never an error.
func TestCollectionErrorsCountCycles(t *testing.T) {
	c, _ := newSnapCollector(t, Config{}, testLogger(t))
	failed := nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}
	timedOut := &nvmlowner.CallError{What: "sample", Err: nvmlowner.ErrTimeout}
	bad := okSample(snapGPU0, nil)
	bad.Values[nvmlowner.FieldPowerUsage] = failed
	cycles := []struct {
		name string
		snap *nvmlowner.Snapshot
		want [2]float64 // errors of GPU 0 and GPU 1 after it
	}{
		{"failed field", &nvmlowner.Snapshot{Seq: 1, Samples: []nvmlowner.Sample{bad, okSample(snapGPU1, nil)}}, [2]float64{1, 0}},
		{"same cycle rendered again", &nvmlowner.Snapshot{Seq: 1, Samples: []nvmlowner.Sample{bad, okSample(snapGPU1, nil)}}, [2]float64{1, 0}},
		{"timed out gpu", &nvmlowner.Snapshot{Seq: 2, Samples: []nvmlowner.Sample{bad, {UUID: snapGPU1, Err: timedOut}}}, [2]float64{2, 1}},
		{"no data only", &nvmlowner.Snapshot{Seq: 3, Samples: []nvmlowner.Sample{
			noData(okSample(snapGPU0, nil), nvmlowner.NotSupported, nvmlowner.FieldRetiredSBE),
			noData(okSample(snapGPU1, nil), nvmlowner.NoPermission, nvmlowner.FieldECCSBEAggregate),
		}}, [2]float64{2, 1}},
	}
	for _, cy := range cycles {
		c.refresh(context.Background(), cy.snap)
		for i, uuid := range []string{snapGPU0, snapGPU1} {
			if got := testutil.ToFloat64(c.errors.WithLabelValues(uuid)); got != cy.want[i] {
				t.Errorf("after %s: collection errors of GPU %d = %v, want %v", cy.name, i, got, cy.want[i])
			}
		}
	}
}

// TestUnavailableFieldGauge: a reading a GPU does not give (NOT_SUPPORTED,
// as retired pages on Ampere and later; NO_PERMISSION) is a visible
// gpu_node_agent_nvml_field_unavailable series, logged once, never a
// collection error; the series goes when the reading comes back or the
// GPU leaves.
func TestUnavailableFieldGauge(t *testing.T) {
	var logs bytes.Buffer
	c, reg := newSnapCollector(t, Config{}, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	retired := []nvmlowner.Field{nvmlowner.FieldRetiredSBE, nvmlowner.FieldRetiredDBE, nvmlowner.FieldRetiredPending}
	gpu0 := noData(okSample(snapGPU0, map[nvmlowner.Field]uint64{nvmlowner.FieldGPUTemp: 40}), nvmlowner.NotSupported, retired...)
	gpu1 := noData(okSample(snapGPU1, map[nvmlowner.Field]uint64{nvmlowner.FieldGPUTemp: 41}), nvmlowner.NoPermission, nvmlowner.FieldECCSBEAggregate)
	const name = "gpu_node_agent_nvml_field_unavailable"
	const header = `# HELP gpu_node_agent_nvml_field_unavailable 1 for each NVML reading (field) a GPU, by UUID, does not give: reason not-supported (the device has no such reading) or no-permission (this process may not read it). No data, not a fault.
# TYPE gpu_node_agent_nvml_field_unavailable gauge
`
	steps := []struct {
		name  string
		node  *topology.Node // nil keeps the node
		snap  *nvmlowner.Snapshot
		want  string
		wantN int // series
	}{
		{
			name: "first cycle",
			snap: &nvmlowner.Snapshot{Seq: 1, Samples: []nvmlowner.Sample{gpu0, gpu1}},
			want: header + `gpu_node_agent_nvml_field_unavailable{device="` + snapGPU0 + `",field="retired-dbe",reason="not-supported"} 1
gpu_node_agent_nvml_field_unavailable{device="` + snapGPU0 + `",field="retired-pending",reason="not-supported"} 1
gpu_node_agent_nvml_field_unavailable{device="` + snapGPU0 + `",field="retired-sbe",reason="not-supported"} 1
gpu_node_agent_nvml_field_unavailable{device="` + snapGPU1 + `",field="ecc-sbe-aggregate",reason="no-permission"} 1
`,
			wantN: 4,
		},
		{
			name:  "same again",
			snap:  &nvmlowner.Snapshot{Seq: 2, Samples: []nvmlowner.Sample{gpu0, gpu1}},
			wantN: 4,
		},
		{
			name: "reading available again",
			snap: &nvmlowner.Snapshot{Seq: 3, Samples: []nvmlowner.Sample{gpu0,
				okSample(snapGPU1, map[nvmlowner.Field]uint64{nvmlowner.FieldECCSBEAggregate: 0})}},
			wantN: 3,
		},
		{
			name:  "gpu leaves the node",
			node:  &topology.Node{GPUs: snapNode().GPUs[1:]},
			snap:  &nvmlowner.Snapshot{Seq: 3, Samples: []nvmlowner.Sample{gpu0, gpu1}},
			wantN: 1,
		},
	}
	for _, st := range steps {
		if st.node != nil {
			c.SetNode(st.node)
		}
		c.refresh(context.Background(), st.snap)
		if st.want != "" {
			if err := testutil.GatherAndCompare(reg, strings.NewReader(st.want), name); err != nil {
				t.Errorf("%s: %v", st.name, err)
			}
		}
		if n := testutil.CollectAndCount(c, name); n != st.wantN {
			t.Errorf("%s: %d %s series, want %d", st.name, n, name, st.wantN)
		}
	}
	if n := testutil.CollectAndCount(c.errors); n != 0 {
		t.Errorf("no data counted as %d collection error series", n)
	}
	// GPU temperatures are still served beside the missing readings.
	if n := testutil.CollectAndCount(c, "DCGM_FI_DEV_GPU_TEMP"); n != 1 {
		t.Errorf("DCGM_FI_DEV_GPU_TEMP series = %d, want 1", n)
	}
	out := logs.String()
	for _, want := range []string{
		"device=" + snapGPU0 + " field=retired-sbe reason=not-supported",
		"device=" + snapGPU0 + " field=retired-dbe reason=not-supported",
		"device=" + snapGPU0 + " field=retired-pending reason=not-supported",
		"device=" + snapGPU1 + " field=ecc-sbe-aggregate reason=no-permission",
	} {
		if n := strings.Count(out, want); n != 1 {
			t.Errorf("%d log lines with %q, want 1:\n%s", n, want, out)
		}
	}
	// Absent data is logged at debug (STYLE.md), once per device, field
	// and reason.
	if n := strings.Count(out, "level=DEBUG msg=\"nvml reading unavailable"); n != 4 {
		t.Errorf("%d debug no-data lines, want 4 (one per device, field and reason):\n%s", n, out)
	}
	if strings.Contains(out, "level=INFO") {
		t.Errorf("no data logged above debug:\n%s", out)
	}
	if strings.Contains(out, "level=WARN") {
		t.Errorf("no data logged as a warning:\n%s", out)
	}
}

// TestLastCollectionTimestamp: each GPU's last read time follows the
// cycles that read it; a GPU that could not be read (hung, lost, NVML
// failing) keeps its last time, so `time() - x` grows for it alone; a
// cycle rendered again moves nothing; a GPU that leaves loses its series.
func TestLastCollectionTimestamp(t *testing.T) {
	c, reg := newSnapCollector(t, Config{}, testLogger(t))
	t1 := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	t2, t3 := t1.Add(10*time.Second), t1.Add(20*time.Second)
	at := func(s nvmlowner.Sample, when time.Time) nvmlowner.Sample { s.Time = when; return s }
	timedOut := &nvmlowner.CallError{What: "sample", Err: nvmlowner.ErrTimeout}
	failed := at(okSample(snapGPU0, nil), t3)
	failed.Values[nvmlowner.FieldPowerUsage] = nvmlowner.Value{Status: nvmlowner.Failed, Err: nvml.ERROR_UNKNOWN}
	libErr := errors.New("nvml device count: ERROR_UNKNOWN")
	const name = "gpu_node_agent_last_collection_timestamp_seconds"
	unix := func(tm time.Time) float64 { return float64(tm.UnixNano()) / 1e9 }
	steps := []struct {
		name string
		node *topology.Node // nil keeps the node
		snap *nvmlowner.Snapshot
		want map[string]float64
	}{
		{"nothing read yet", nil, &nvmlowner.Snapshot{Seq: 1, Time: t1, LibErr: libErr, Samples: []nvmlowner.Sample{
			{UUID: snapGPU0, Time: t1, Err: libErr}, {UUID: snapGPU1, Time: t1, Err: libErr}}}, map[string]float64{}},
		{"both read", nil, &nvmlowner.Snapshot{Seq: 2, Time: t1, Samples: []nvmlowner.Sample{
			at(okSample(snapGPU0, nil), t1), at(okSample(snapGPU1, nil), t1)}},
			map[string]float64{snapGPU0: unix(t1), snapGPU1: unix(t1)}},
		{"GPU 1 hangs", nil, &nvmlowner.Snapshot{Seq: 3, Time: t2, Samples: []nvmlowner.Sample{
			at(okSample(snapGPU0, nil), t2), {UUID: snapGPU1, Time: t2, Err: timedOut}}},
			map[string]float64{snapGPU0: unix(t2), snapGPU1: unix(t1)}},
		{"a failed reading still is a read", nil, &nvmlowner.Snapshot{Seq: 4, Time: t3, Samples: []nvmlowner.Sample{
			failed, {UUID: snapGPU1, Time: t3, Err: timedOut}}},
			map[string]float64{snapGPU0: unix(t3), snapGPU1: unix(t1)}},
		{"NVML fails for all", nil, &nvmlowner.Snapshot{Seq: 5, Time: t3.Add(time.Minute), LibErr: libErr, Samples: []nvmlowner.Sample{
			{UUID: snapGPU0, Time: t3.Add(time.Minute), Err: libErr}, {UUID: snapGPU1, Time: t3.Add(time.Minute), Err: libErr}}},
			map[string]float64{snapGPU0: unix(t3), snapGPU1: unix(t1)}},
		{"GPU 0 leaves", &topology.Node{GPUs: snapNode().GPUs[1:]}, &nvmlowner.Snapshot{Seq: 5, Time: t3.Add(time.Minute), LibErr: libErr,
			Samples: []nvmlowner.Sample{{UUID: snapGPU1, Time: t3.Add(time.Minute), Err: libErr}}},
			map[string]float64{snapGPU1: unix(t1)}},
	}
	for _, st := range steps {
		if st.node != nil {
			c.SetNode(st.node)
		}
		c.refresh(context.Background(), st.snap)
		got := map[string]float64{}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
		if !maps.Equal(got, st.want) {
			t.Errorf("%s: %s = %v, want %v", st.name, name, got, st.want)
		}
	}
}

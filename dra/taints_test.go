package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestTaints(t *testing.T) {
	model, err := sim.Profile("dgx-h100", sim.WithMIG(1, "3g.40gb", "1g.10gb"))
	if err != nil {
		t.Fatal(err)
	}
	// GPU 7 was lost before its UUID could be read.
	model.GPUs[7].UUID, model.GPUs[7].Lost = "", true
	mig := model.GPUs[1].MIG[1]
	res, err := Build(model, Options{Unhealthy: map[string]Fault{
		model.GPUs[0].UUID:     {Cause: "xid 79"},
		mig.UUID:               {Cause: "ecc-dbe", Effect: resourceapi.DeviceTaintEffectNoExecute},
		"mlx5_3":               {Cause: "port down: ib0 (Polling)"},
		topology.LostGPUID(7):  {Cause: "gpu-lost"},
		"GPU-not-on-this-node": {Cause: "xid-48"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]resourceapi.DeviceTaint{
		"gpu-0":         {Key: TaintKey, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		MIGName(1, mig): {Key: TaintKey, Value: "ecc-dbe", Effect: resourceapi.DeviceTaintEffectNoExecute},
		"nic-mlx5-3":    {Key: TaintKey, Value: "port-down--ib0--Polling", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		"gpu-7":         {Key: TaintKey, Value: "gpu-lost", Effect: resourceapi.DeviceTaintEffectNoSchedule},
	}
	for _, d := range res.Devices {
		w, tainted := want[d.Name]
		switch {
		case !tainted && len(d.Taints) > 0:
			t.Errorf("%s: healthy but tainted %v", d.Name, d.Taints)
		case tainted && (len(d.Taints) != 1 || d.Taints[0] != w):
			t.Errorf("%s: taints %v, want [%v]", d.Name, d.Taints, w)
		}
		delete(want, d.Name)
		for _, taint := range d.Taints {
			if errs := validation.IsValidLabelValue(taint.Value); len(errs) > 0 {
				t.Errorf("%s: taint value %q: %v", d.Name, taint.Value, errs)
			}
		}
	}
	for name := range want {
		t.Errorf("%s: not published", name)
	}
}

func TestLabelValue(t *testing.T) {
	long := ""
	for range 40 {
		long += "ab"
	}
	for _, tc := range []struct{ in, want string }{
		{"xid-79", "xid-79"},
		{"xid 79", "xid-79"},
		{"  nvml: timeout ", "nvml--timeout"},
		{"", "unknown"},
		{"---", "unknown"},
		{long, long[:63]},
		{"a" + long, ("a" + long)[:63]},
	} {
		got := labelValue(tc.in)
		if got != tc.want {
			t.Errorf("labelValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("labelValue(%q) = %q: %v", tc.in, got, errs)
		}
	}
}

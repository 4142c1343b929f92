package dra

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

// chartDeviceClasses is the chart's DeviceClass template: a selector
// written once with {{ $kind }} for the device type, and one with
// {{ $profile }} for the MIG-profile classes of extended resources.
const chartDeviceClasses = "../deploy/chart/gpu-node-agent/templates/deviceclasses.yaml"

// TestChartDeviceClasses compiles the chart's DeviceClass selector with the
// DRA CEL library (what the scheduler runs) for each kind and checks that,
// over the golden slices, it selects exactly the devices of that kind and
// of this driver, and nothing of another driver with the same attributes;
// the MIG-profile template, instantiated with each golden MIG profile,
// selects exactly that profile's devices.
func TestChartDeviceClasses(t *testing.T) {
	st := chartSelectors(t)
	template, profileTemplate := st.kind, st.profile
	var devs []resourceapi.Device
	for _, tc := range goldenCases {
		b, err := os.ReadFile(filepath.Join("testdata", tc.name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var slices [][]resourceapi.Device
		if err := json.Unmarshal(b, &slices); err != nil {
			t.Fatal(err)
		}
		for _, s := range slices {
			devs = append(devs, s...)
		}
	}
	for _, kind := range []string{TypeGPU, TypeMIG, TypeNIC} {
		t.Run(kind, func(t *testing.T) {
			expr := instantiate(template, kind, "", false)
			res := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
			if res.Error != nil {
				t.Fatalf("compile %q: %v", expr, res.Error)
			}
			matched := 0
			for _, d := range devs {
				for _, driver := range []string{DriverName, "gpu.nvidia.com"} {
					got, _, err := res.DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
					if err != nil {
						t.Fatalf("%s on %s: %v", expr, d.Name, err)
					}
					want := driver == DriverName && str(d, AttrType) == kind
					if got != want {
						t.Errorf("%s (driver %s, type %s): selected %v", d.Name, driver, str(d, AttrType), got)
					}
					if got {
						matched++
					}
				}
			}
			if matched == 0 {
				t.Errorf("class %s selects no golden device", kind)
			}
		})
	}
	profiles := map[string]bool{}
	for _, d := range devs {
		if str(d, AttrType) == TypeMIG {
			profiles[str(d, AttrProfile)] = true
		}
	}
	if len(profiles) == 0 {
		t.Fatal("no MIG device in the golden slices")
	}
	for profile := range profiles {
		t.Run("mig-"+profile, func(t *testing.T) {
			expr := instantiate(profileTemplate, "", profile, false)
			res := cel.GetCompiler(cel.Features{}).CompileCELExpression(expr, cel.Options{})
			if res.Error != nil {
				t.Fatalf("compile %q: %v", expr, res.Error)
			}
			for _, d := range devs {
				for _, driver := range []string{DriverName, "gpu.nvidia.com"} {
					got, _, err := res.DeviceMatches(context.Background(), cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
					if err != nil {
						t.Fatalf("%s on %s: %v", expr, d.Name, err)
					}
					want := driver == DriverName && str(d, AttrType) == TypeMIG && str(d, AttrProfile) == profile
					if got != want {
						t.Errorf("%s (driver %s, type %s, profile %s): selected %v", d.Name, driver, str(d, AttrType), str(d, AttrProfile), got)
					}
				}
			}
		})
	}
}

// selectorTemplates are the chart's selector templates: by kind, by MIG
// profile, of the shared classes and of the RDMA-resource classes.
type selectorTemplates struct{ kind, profile, shared, rdma string }

func chartSelectors(t *testing.T) selectorTemplates {
	t.Helper()
	text, err := os.ReadFile(chartDeviceClasses)
	if err != nil {
		t.Fatal(err)
	}
	var st selectorTemplates
	for _, m := range regexp.MustCompile(`(?m)^\s*expression: (.*)$`).FindAllSubmatch(text, -1) {
		switch e := string(m[1]); {
		case strings.Contains(e, "{{ $profile }}") && st.profile == "":
			st.profile = e
		case strings.Contains(e, "{{ $r.name }}") && st.rdma == "":
			st.rdma = e
		case strings.Contains(e, "{{ $kind }}") && strings.Contains(e, "{{ $exclusive }}") && st.kind == "":
			st.kind = e
		case strings.Contains(e, "{{ $kind }}") && strings.HasSuffix(e, "device.allowMultipleAllocations") && st.shared == "":
			st.shared = e
		default:
			t.Fatalf("%s: selector %q is none of the kind's, the profile's, the shared or the RDMA classes' template, or a second one", chartDeviceClasses, e)
		}
	}
	if st.kind == "" || st.profile == "" || st.shared == "" || st.rdma == "" {
		t.Fatalf("%s: selector templates %+v; want all four", chartDeviceClasses, st)
	}
	return st
}

// instantiate fills a selector template as the chart renders it for kind
// and profile, with dra.sharing.enabled or not.
func instantiate(tmpl, kind, profile string, sharing bool) string {
	exclusive := ""
	if sharing {
		exclusive = " && !device.allowMultipleAllocations"
	}
	if kind == TypeNIC {
		exclusive = ""
	}
	return strings.NewReplacer(
		"{{ $kind }}", kind, "{{ $profile }}", profile, `{{ if ne $kind "nic" }}`, "", "{{ end }}", "",
		"{{ $exclusive }}", exclusive,
	).Replace(tmpl)
}

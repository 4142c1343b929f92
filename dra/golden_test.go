package dra

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

var update = flag.Bool("update", false, "rewrite dra/testdata/*.json from the builder")

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// goldenCases are the simulated nodes whose slices are golden files.
var goldenCases = []struct {
	name    string
	profile string
	opts    []sim.ProfileOption
}{
	{name: "dgx-h100", profile: "dgx-h100"},
	{
		name: "dgx-a100-mig", profile: "dgx-a100",
		opts: []sim.ProfileOption{
			sim.WithMIG(0, repeat("1g.5gb", 7)...),
			sim.WithMIG(1, "3g.20gb", "2g.10gb", "1g.5gb"),
			sim.WithMIG(2, "7g.40gb"),
		},
	},
	{name: "pcie-8gpu", profile: "pcie-8gpu"},
	{name: "gb200-nvl72", profile: "gb200-nvl72"},
}

// simNode returns a profile's model and the host root the simulator wrote
// its sysfs under, so the library's pcieRoot helper reads a PCI tree.
func simNode(t *testing.T, profile string, opts ...sim.ProfileOption) (*topology.Node, string) {
	t.Helper()
	model, err := sim.Profile(profile, opts...)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	node, err := sim.New(model, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The simulator fills in the driver and CUDA versions it serves.
	return node.Spec(), root
}

func buildSim(t *testing.T, profile string, opts ...sim.ProfileOption) (*topology.Node, Result) {
	t.Helper()
	model, root := simNode(t, profile, opts...)
	res, err := Build(model, Options{PCIeRoot: SysfsPCIeRoot(root)})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unread) > 0 {
		t.Fatalf("unread attributes on a simulated node: %v", res.Unread)
	}
	return model, res
}

func TestGoldenSlices(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			_, res := buildSim(t, tc.profile, tc.opts...)
			got, err := json.MarshalIndent(Split(res.Devices), "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", tc.name+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./dra -run TestGoldenSlices -update)", err)
			}
			if d := cmp.Diff(string(want), string(got)); d != "" {
				t.Errorf("slices of %s differ from %s (-want +got):\n%s", tc.name, path, d)
			}
		})
	}
}

// cIdentifier is what the part of an attribute or capacity name after the
// domain must be (resource/v1 QualifiedName), at most DeviceMaxIDLength.
var cIdentifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// TestDevicesWithinAPILimits checks every simulated profile's devices
// against resource/v1 validation as the API server applies it.
func TestDevicesWithinAPILimits(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			_, res := buildSim(t, tc.profile, tc.opts...)
			checkAPILimits(t, res.Devices)
		})
	}
	for _, profile := range sim.Profiles() {
		t.Run(profile, func(t *testing.T) {
			_, res := buildSim(t, profile)
			checkAPILimits(t, res.Devices)
		})
	}
}

func checkAPILimits(t *testing.T, devs []resourceapi.Device) {
	t.Helper()
	if len(devs) == 0 {
		t.Fatal("no devices")
	}
	seen := map[string]bool{}
	for _, d := range devs {
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			t.Errorf("device name %q is not a DNS label: %v", d.Name, errs)
		}
		if seen[d.Name] {
			t.Errorf("device name %q repeats", d.Name)
		}
		seen[d.Name] = true
		if k := len(d.Attributes) + len(d.Capacity); k > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			t.Errorf("%s: %d attributes and capacities, the API allows %d", d.Name, k, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
		}
		names := map[resourceapi.QualifiedName]bool{}
		for n := range d.Attributes {
			names[n] = true
		}
		for n := range d.Capacity {
			if names[n] {
				t.Errorf("%s: %s is both an attribute and a capacity", d.Name, n)
			}
			names[n] = true
		}
		for n := range names {
			domain, id, qualified := strings.Cut(string(n), "/")
			if !qualified {
				id, domain = domain, ""
			}
			if domain != "" {
				if errs := validation.IsDNS1123Subdomain(domain); len(errs) > 0 || len(domain) > resourceapi.DeviceMaxDomainLength {
					t.Errorf("%s: %s: bad domain: %v", d.Name, n, errs)
				}
			}
			if !cIdentifier.MatchString(id) || len(id) > resourceapi.DeviceMaxIDLength {
				t.Errorf("%s: %s: %q is not a C identifier of at most %d characters", d.Name, n, id, resourceapi.DeviceMaxIDLength)
			}
		}
		for n, v := range d.Attributes {
			set := 0
			for _, p := range []bool{v.StringValue != nil, v.IntValue != nil, v.BoolValue != nil, v.VersionValue != nil} {
				if p {
					set++
				}
			}
			if set != 1 {
				t.Errorf("%s: %s: %d values set, want exactly one", d.Name, n, set)
			}
			if v.StringValue != nil && (len(*v.StringValue) > resourceapi.DeviceAttributeMaxValueLength || *v.StringValue == "") {
				t.Errorf("%s: %s: string value %q empty or longer than %d", d.Name, n, *v.StringValue, resourceapi.DeviceAttributeMaxValueLength)
			}
			if v.VersionValue != nil && !regexp.MustCompile(`^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$`).MatchString(*v.VersionValue) {
				t.Errorf("%s: %s: %q is not a semantic version", d.Name, n, *v.VersionValue)
			}
		}
		for _, taint := range d.Taints {
			if errs := validation.IsQualifiedName(taint.Key); len(errs) > 0 {
				t.Errorf("%s: taint key %q: %v", d.Name, taint.Key, errs)
			}
			if errs := validation.IsValidLabelValue(taint.Value); len(errs) > 0 {
				t.Errorf("%s: taint value %q: %v", d.Name, taint.Value, errs)
			}
		}
	}
	for i, s := range Split(devs) {
		if len(s) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice %d holds %d devices, at most %d with taints", i, len(s), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		}
	}
}

func str(d resourceapi.Device, name resourceapi.QualifiedName) string {
	if v, ok := d.Attributes[name]; ok && v.StringValue != nil {
		return *v.StringValue
	}
	return ""
}

func byName(devs []resourceapi.Device) map[string]resourceapi.Device {
	out := map[string]resourceapi.Device{}
	for _, d := range devs {
		out[d.Name] = d
	}
	return out
}

// TestPCIeRootAlignsGPUAndNIC: the root the library's helper reads from the
// simulated sysfs is the host bridge the model's PCI path starts at, and a
// GPU and a NIC the simulator hangs off one PCIe switch share it, which is
// what a claim's matchAttribute on resource.kubernetes.io/pcieRoot needs.
func TestPCIeRootAlignsGPUAndNIC(t *testing.T) {
	for _, profile := range []string{"dgx-h100", "dgx-a100", "dgx-1v"} {
		t.Run(profile, func(t *testing.T) {
			model, res := buildSim(t, profile)
			devs := byName(res.Devices)
			root := deviceattribute.StandardDeviceAttributePCIeRoot
			for _, g := range model.GPUs {
				if want, got := "pci"+g.PCIPath[0][:7], str(devs[GPUName(g.Index)], root); got != want {
					t.Errorf("gpu %d: pcieRoot %q, want %q (its root port %s)", g.Index, got, want, g.PCIPath[0])
				}
			}
			pairs := 0
			for _, nic := range model.NICs {
				nicRoot := str(devs[NICName(nic.Name)], root)
				if want := "pci" + nic.PCIPath[0][:7]; nicRoot != want {
					t.Errorf("%s: pcieRoot %q, want %q", nic.Name, nicRoot, want)
				}
				for _, l := range nic.GPUs {
					if l.PCIe != topology.PCIeSingleSwitch {
						continue
					}
					pairs++
					gpu := devs[GPUName(l.GPU)]
					if gpuRoot := str(gpu, root); gpuRoot != nicRoot {
						t.Errorf("%s and gpu %d share a PCIe switch but not a pcieRoot: %q vs %q", nic.Name, l.GPU, nicRoot, gpuRoot)
					}
				}
				// pcieSwitch is shared exactly by the pairs the model puts
				// under one switch.
				for _, l := range nic.GPUs {
					same := str(devs[NICName(nic.Name)], AttrPCIeSwitch) == str(devs[GPUName(l.GPU)], AttrPCIeSwitch) && str(devs[GPUName(l.GPU)], AttrPCIeSwitch) != ""
					if same != (l.PCIe == topology.PCIeSingleSwitch) {
						t.Errorf("%s and gpu %d (%s): share pcieSwitch %v", nic.Name, l.GPU, l.PCIe, same)
					}
				}
			}
			if pairs == 0 {
				t.Fatalf("%s: no GPU-NIC pair under one switch; the test checks nothing", profile)
			}
		})
	}
}

// TestBuildStable: two discoveries of the same node (two simulators, two
// sysfs trees) publish identical devices, so a restart rewrites no slice.
func TestBuildStable(t *testing.T) {
	opts := goldenCases[1].opts
	_, a := buildSim(t, "dgx-a100", opts...)
	_, b := buildSim(t, "dgx-a100", opts...)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("two builds of one node differ:\n%s", cmp.Diff(a, b))
	}
}

// TestMIGDevices: a GPU in MIG mode is offered as its MIG devices only,
// each with its parent's identity and PCIe placement.
func TestMIGDevices(t *testing.T) {
	model, res := buildSim(t, "dgx-a100", goldenCases[1].opts...)
	devs := byName(res.Devices)
	migs := 0
	for _, g := range model.GPUs {
		_, whole := devs[GPUName(g.Index)]
		if whole == g.MIGEnabled {
			t.Errorf("gpu %d (MIG enabled %v): whole GPU offered %v", g.Index, g.MIGEnabled, whole)
		}
		for _, m := range g.MIG {
			migs++
			d, ok := devs[MIGName(g.Index, m)]
			if !ok {
				t.Errorf("gpu %d: mig %s (%s) not offered", g.Index, m.UUID, m.Profile)
				continue
			}
			for name, want := range map[resourceapi.QualifiedName]string{
				AttrType: TypeMIG, AttrUUID: m.UUID, AttrProfile: m.Profile, AttrParentUUID: g.UUID,
				deviceattribute.StandardDeviceAttributePCIBusID: g.PCIBusID,
				deviceattribute.StandardDeviceAttributePCIeRoot: "pci" + g.PCIPath[0][:7],
			} {
				if got := str(d, name); got != want {
					t.Errorf("%s: %s = %q, want %q", d.Name, name, got, want)
				}
			}
			mem := d.Capacity[CapMemory].Value
			if got := mem.Value(); got != int64(m.MemoryMiB)<<20 {
				t.Errorf("%s: memory %d bytes, want %d MiB", d.Name, got, m.MemoryMiB)
			}
		}
	}
	if migs != 7+3+1 {
		t.Fatalf("%d MIG devices in the model, want the 11 of the layout", migs)
	}
	if want := len(model.GPUs) - 3 + migs + len(model.NICs); len(res.Devices) != want {
		t.Errorf("%d devices, want %d", len(res.Devices), want)
	}
}

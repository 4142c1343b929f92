package dra

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestDeviceNames(t *testing.T) {
	for _, tc := range []struct {
		name, got, want string
	}{
		{"gpu", GPUName(0), "gpu-0"},
		{"gpu two digits", GPUName(15), "gpu-15"},
		{"mig", MIGName(0, topology.MIGDevice{Profile: "1g.10gb", GPUInstance: 3, ComputeInstance: 0}), "gpu-0-mig-1g10gb-3-0"},
		{"mig media extensions", MIGName(7, topology.MIGDevice{Profile: "1g.20gb+me", GPUInstance: 13, ComputeInstance: 1}), "gpu-7-mig-1g20gb-me-13-1"},
		{"mig all media engines", MIGName(1, topology.MIGDevice{Profile: "1g.24gb+me.all", GPUInstance: 9}), "gpu-1-mig-1g24gb-meall-9-0"},
		{"mig upper case profile", MIGName(2, topology.MIGDevice{Profile: "7G.80GB", GPUInstance: 0}), "gpu-2-mig-7g80gb-0-0"},
		{"nic", NICName("mlx5_0"), "nic-mlx5-0"},
		{"nic bond", NICName("mlx5_bond_0"), "nic-mlx5-bond-0"},
		{"nic predictable name", NICName("ibp12s0"), "nic-ibp12s0"},
		{"nic upper case and odd characters", NICName("RoCE.P2_1"), "nic-rocep2-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
			if errs := validation.IsDNS1123Label(tc.got); len(errs) > 0 {
				t.Errorf("%q is not a DNS label: %v", tc.got, errs)
			}
		})
	}
}

// TestMIGNameUniqueOnParent: the instance IDs make MIG names unique on a
// GPU even when two profiles spell the same once sanitised.
func TestMIGNameUniqueOnParent(t *testing.T) {
	seen := map[string]topology.MIGDevice{}
	for gi := range 15 {
		for ci := range 8 {
			for _, p := range []string{"1g.10gb", "1g.10gb+me", "1g.10gb-me"} {
				m := topology.MIGDevice{Profile: p, GPUInstance: gi, ComputeInstance: ci}
				name := MIGName(0, m)
				if prev, dup := seen[name]; dup && (prev.GPUInstance != gi || prev.ComputeInstance != ci) {
					t.Fatalf("%q names gi %d ci %d and gi %d ci %d", name, prev.GPUInstance, prev.ComputeInstance, gi, ci)
				}
				seen[name] = m
			}
		}
	}
}

func TestBuildRejectsInvalidNames(t *testing.T) {
	long := ""
	for range 70 {
		long += "x"
	}
	for _, tc := range []struct {
		name string
		nics []string
	}{
		{"two nics sanitised alike", []string{"mlx5_0", "mlx5-0"}},
		{"name longer than a DNS label", []string{long}},
		{"nothing left of the name", []string{"__"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &topology.Node{}
			for _, name := range tc.nics {
				n.NICs = append(n.NICs, topology.NIC{Name: name, NUMANode: -1})
			}
			if _, err := Build(n, Options{}); err == nil {
				t.Fatalf("Build accepted NICs %q", tc.nics)
			} else {
				t.Log(err)
			}
		})
	}
}

func TestSemver(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"570.172.08", "570.172.8", true},
		{"535.104", "535.104.0", true},
		{"9.0", "9.0.0", true},
		{"12", "12.0.0", true},
		{"", "", false},
		{"1.2.3.4", "", false},
		{"570.beta", "", false},
		{"-1.0", "", false},
	} {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, ok := semver(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("semver(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestTypeOf(t *testing.T) {
	for name, want := range map[string]string{
		"gpu-0": TypeGPU, "gpu-12": TypeGPU, "gpu-1-mig-3g20gb-1-0": TypeMIG, "gpu-0-mig-1g24gb-meall-9-0": TypeMIG,
		"nic-mlx5-0": TypeNIC, "fpga-0": "", "": "",
	} {
		if got := TypeOf(name); got != want {
			t.Errorf("TypeOf(%q) = %q, want %q", name, got, want)
		}
	}
}

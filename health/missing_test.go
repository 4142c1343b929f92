package health

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// pciDev is one /sys/bus/pci/devices entry of a fixture tree.
type pciDev struct{ bdf, vendor, class string }

// pciTree writes devs under a new host root, as sysfs has them: a
// directory under /sys/devices and a symlink to it in /sys/bus/pci/devices.
func pciTree(t *testing.T, devs ...pciDev) string {
	t.Helper()
	root := t.TempDir()
	bus := filepath.Join(root, "sys/bus/pci/devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		dir := filepath.Join(root, "sys/devices/pci0000:00", d.bdf)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"vendor": d.vendor, "class": d.class} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(dir, filepath.Join(bus, d.bdf)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func nodeWith(busIDs ...string) *topology.Node {
	n := &topology.Node{}
	for i, b := range busIDs {
		n.GPUs = append(n.GPUs, topology.GPU{Index: i, UUID: "GPU-" + b, PCIBusID: b})
	}
	return n
}

func TestMissingGPUs(t *testing.T) {
	gpu := func(bdf string) pciDev { return pciDev{bdf, "0x10de", "0x030200"} }
	tests := []struct {
		name     string
		devs     []pciDev
		noTree   bool
		node     *topology.Node
		expected int
		disabled bool
		// wantBus is what GPUsOnPCI finds; wantReason is empty for a
		// Cleared observation, else every part of the Fatal one's reason.
		wantBus    []string
		wantReason []string
	}{
		{name: "all present", devs: []pciDev{gpu("0000:3b:00.0"), gpu("0000:86:00.0")},
			node: nodeWith("0000:3b:00.0", "0000:86:00.0"), wantBus: []string{"0000:3b:00.0", "0000:86:00.0"}},
		{name: "one not listed by nvml", devs: []pciDev{gpu("0000:3b:00.0"), gpu("0000:86:00.0"), gpu("0000:af:00.0")},
			node:       nodeWith("0000:86:00.0"),
			wantBus:    []string{"0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"},
			wantReason: []string{"gpu 0000:3b:00.0 on the PCI bus is not listed by NVML", "gpu 0000:af:00.0 on the PCI bus is not listed by NVML"}},
		{name: "nvml spelling of the bus id", devs: []pciDev{gpu("0000:3b:00.0")},
			node: nodeWith("00000000:3B:00.0"), wantBus: []string{"0000:3b:00.0"}},
		{name: "extra gpu listed, not on the bus (no host sysfs)", noTree: true,
			node: nodeWith("0000:3b:00.0")},
		{name: "expected count met", devs: []pciDev{gpu("0000:3b:00.0")}, expected: 1,
			node: nodeWith("0000:3b:00.0"), wantBus: []string{"0000:3b:00.0"}},
		{name: "fewer than expected, bus agrees with nvml", devs: []pciDev{gpu("0000:3b:00.0")}, expected: 8,
			node: nodeWith("0000:3b:00.0"), wantBus: []string{"0000:3b:00.0"},
			wantReason: []string{"expected 8 gpus, NVML lists 1"}},
		{name: "class 0x0380 and vga", devs: []pciDev{{"0000:01:00.0", "0x10de", "0x038000"}, {"0000:02:00.0", "0x10de", "0x030000"}},
			node: nodeWith(), wantBus: []string{"0000:02:00.0"},
			wantReason: []string{"gpu 0000:02:00.0 on the PCI bus is not listed by NVML"}},
		{name: "nvswitch bridge and another vendor's gpu", devs: []pciDev{{"0000:05:00.0", "0x10de", "0x068000"}, {"0000:06:00.0", "0x1002", "0x030200"}},
			node: nodeWith()},
		{name: "listed gpu without bus id covers one unmatched", devs: []pciDev{gpu("0000:3b:00.0"), gpu("0000:86:00.0")},
			node:    &topology.Node{GPUs: []topology.GPU{{UUID: "GPU-a", PCIBusID: "0000:86:00.0"}, {Index: 1, UUID: topology.LostGPUID(1), Lost: true}}},
			wantBus: []string{"0000:3b:00.0", "0000:86:00.0"}},
		{name: "no gpus, no nvml", node: nil},
		{name: "nvml unavailable with gpus on the bus", devs: []pciDev{gpu("0000:3b:00.0")}, node: nil,
			wantBus: []string{"0000:3b:00.0"}, wantReason: []string{"nvml unavailable with NVIDIA GPUs on the PCI bus (0000:3b:00.0)"}},
		{name: "check disabled", devs: []pciDev{gpu("0000:3b:00.0")}, node: nodeWith(), disabled: true,
			wantBus: []string{"0000:3b:00.0"}},
		{name: "check disabled keeps nvml unavailable", devs: []pciDev{gpu("0000:3b:00.0")}, node: nil, disabled: true,
			wantBus: []string{"0000:3b:00.0"}, wantReason: []string{"nvml unavailable with NVIDIA GPUs"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if !tc.noTree {
				root = pciTree(t, tc.devs...)
			}
			onBus, err := GPUsOnPCI(root)
			if err != nil {
				t.Fatalf("GPUsOnPCI: %v", err)
			}
			if !slices.Equal(onBus, tc.wantBus) {
				t.Errorf("GPUsOnPCI = %v, want %v", onBus, tc.wantBus)
			}
			cfg := Config{ExpectedGPUs: tc.expected}
			if tc.disabled {
				cfg.DisabledChecks = []string{CheckMissing}
			}
			o := MissingGPUs(cfg, onBus, tc.node)
			if o.DeviceID != NodeID || o.Check != CheckMissing {
				t.Errorf("observation on %q check %q, want %q %q", o.DeviceID, o.Check, NodeID, CheckMissing)
			}
			if len(tc.wantReason) == 0 {
				if !o.Cleared || o.Fatal {
					t.Errorf("got %+v, want Cleared", o)
				}
				return
			}
			if !o.Fatal || o.Cleared {
				t.Fatalf("got %+v, want Fatal", o)
			}
			for _, r := range tc.wantReason {
				if !strings.Contains(o.Reason, r) {
					t.Errorf("reason %q does not say %q", o.Reason, r)
				}
			}
		})
	}
}

func TestExpectedGPUsValidation(t *testing.T) {
	tests := []struct {
		name    string
		n       int
		wantErr bool
	}{{"zero: bus only", 0, false}, {"eight", 8, false}, {"negative", -1, true}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Config{ExpectedGPUs: tc.n}.Validate()
			if (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), "health.expectedGPUs")) {
				t.Errorf("Validate() = %v, want error %t", err, tc.wantErr)
			}
		})
	}
}

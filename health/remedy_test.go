package health

import (
	"reflect"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

func TestRemedies(t *testing.T) {
	m, err := NewMonitor(Config{DCGMMode: DCGMOff, MIGDevicesServed: true}, nil, discard(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m.SetNode(&topology.Node{GPUs: []topology.GPU{
		{Index: 0, UUID: "GPU-0"},
		{Index: 1, UUID: "GPU-1", MIGEnabled: true, MIG: []topology.MIGDevice{{UUID: "MIG-1-a"}}},
		{Index: 2, UUID: "GPU-2"},
		{Index: 3, UUID: "GPU-3"},
	}})
	if got := m.Remedies(); got != nil {
		t.Fatalf("healthy node: %+v", got)
	}
	// A reset-class XID on GPU 0, one on a MIG device of GPU 1, a
	// reboot-class XID with a reset-class one on GPU 2, and an NVLink
	// fault (no reset, no reboot) on GPU 3.
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckXID, Key: "xid 48", XID: 48, Fatal: true, Event: true, Reason: "xid 48"})
	m.Observe(Observation{DeviceID: "MIG-1-a", Check: CheckXID, Key: "xid 95", XID: 95, Fatal: true, Event: true, Reason: "xid 95"})
	m.Observe(Observation{DeviceID: "GPU-2", Check: CheckXID, Key: "xid 48", XID: 48, Fatal: true, Event: true, Reason: "xid 48"})
	m.Observe(Observation{DeviceID: "GPU-2", Check: CheckXID, Key: "xid 79", XID: 79, Fatal: true, Event: true, Reason: "xid 79"})
	m.Observe(Observation{DeviceID: "GPU-3", Check: CheckNVLink, Key: "link 3", Fatal: true, Reason: "nvlink 3 down"})
	type r struct{ dev, gpu, action string }
	var got []r
	for _, x := range m.Remedies() {
		got = append(got, r{x.Device, x.GPU, x.Action})
	}
	want := []r{{"GPU-0", "GPU-0", ActionResetGPU}, {"GPU-2", "GPU-2", ActionReboot}, {"MIG-1-a", "GPU-1", ActionResetGPU}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Remedies = %+v, want %+v", got, want)
	}
	for _, x := range m.Remedies() {
		if x.Seen.IsZero() {
			t.Errorf("%s: Seen not set", x.Device)
		}
	}
	// Reset evidence releases GPU 0's held fault: it recovers and asks
	// for nothing more.
	m.Observe(Observation{DeviceID: "GPU-0", Check: CheckReset, Reset: true, Reason: "the agent reset the GPU"})
	for _, x := range m.Remedies() {
		if x.GPU == "GPU-0" {
			t.Fatalf("GPU-0 still asks for %s after reset evidence", x.Action)
		}
	}
}

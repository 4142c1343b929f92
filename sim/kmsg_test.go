package sim

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/kernlog"
)

// kmsgEvents parses the simulated /dev/kmsg as the agent does.
func kmsgEvents(t *testing.T, n *Node) []kernlog.Event {
	t.Helper()
	f, err := os.Open(filepath.Join(n.HostRoot(), "dev", "kmsg"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var p kernlog.Parser
	var out []kernlog.Event
	var seq uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rec, err := kernlog.ParseKmsg(sc.Bytes())
		if err != nil {
			t.Fatalf("simulated kmsg record %q: %v", sc.Text(), err)
		}
		if rec.Seq != seq+1 {
			t.Errorf("record seq %d after %d", rec.Seq, seq)
		}
		seq = rec.Seq
		if e, ok := p.Parse(rec.Message); ok {
			out = append(out, e)
		}
	}
	return out
}

// TestKmsgFaults: XID, gpu-lost and sxid faults write the drivers' lines,
// which the agent's parser reads back as the same fault on the same GPU.
func TestKmsgFaults(t *testing.T) {
	n := newTestNode(t, "dgx-h100", WithMIG(2, "3g.40gb", "3g.40gb"))
	bus1 := kernlog.BusIDOf(n.Spec().GPUs[1].PCIBusID)
	bus3 := kernlog.BusIDOf(n.Spec().GPUs[3].PCIBusID)
	mig := n.Spec().GPUs[2].MIG[1]
	for _, f := range []Fault{
		{Kind: FaultXID, GPU: 1, XID: 48},
		{Kind: FaultXID, GPU: 2, XID: 31, MIG: mig.UUID},
		{Kind: FaultXID, GPU: -1, XID: 13}, // no device: no line
		{Kind: FaultGPULost, GPU: 3},
		{Kind: FaultSXID, XID: 24007, Link: 28},
		{Kind: FaultSXID, XID: 20009, Link: 4, NonFatal: true},
	} {
		if err := n.InjectFault(f); err != nil {
			t.Fatalf("inject %+v: %v", f, err)
		}
	}
	got := kmsgEvents(t, n)
	if len(got) != 6 {
		t.Fatalf("events %+v, want 6", got)
	}
	check := func(i int, kind, bus string, code uint64) {
		t.Helper()
		if got[i].Kind != kind || got[i].BusID != bus || got[i].Code != code {
			t.Errorf("event %d %+v, want %s %s %d", i, got[i], kind, bus, code)
		}
	}
	check(0, kernlog.KindXID, bus1, 48)
	check(1, kernlog.KindXID, kernlog.BusIDOf(n.Spec().GPUs[2].PCIBusID), 31)
	if got[1].GPUInstance != uint32(mig.GPUInstance) || got[1].ComputeInstance != uint32(mig.ComputeInstance) {
		t.Errorf("MIG xid attributed to GI %d CI %d, want %d %d", got[1].GPUInstance, got[1].ComputeInstance, mig.GPUInstance, mig.ComputeInstance)
	}
	check(2, kernlog.KindFallenOffBus, bus3, 0)
	check(3, kernlog.KindXID, bus3, 79)
	check(4, kernlog.KindSXID, "0000:05:00", 24007)
	check(5, kernlog.KindSXID, "0000:05:00", 20009)
	if !got[4].Fatal || got[5].Fatal {
		t.Errorf("sxid severities %v %v, want fatal then non-fatal", got[4].Fatal, got[5].Fatal)
	}
	if !strings.HasPrefix(got[4].Text, "Fatal, Link 28 ") {
		t.Errorf("sxid text %q", got[4].Text)
	}
}

// TestKmsgSXIDNeedsNVSwitch: a node without an NVSwitch fabric refuses an
// SXid, and an SXid needs its number.
func TestKmsgSXIDNeedsNVSwitch(t *testing.T) {
	n := newTestNode(t, "pcie-8gpu")
	if err := n.InjectFault(Fault{Kind: FaultSXID, XID: 24007}); err == nil || !strings.Contains(err.Error(), "no NVSwitch") {
		t.Errorf("sxid on a PCIe node: %v, want an error saying it has no NVSwitch", err)
	}
	h := newTestNode(t, "dgx-h100")
	if err := h.InjectFault(Fault{Kind: FaultSXID}); err == nil || !strings.Contains(err.Error(), "xid: required") {
		t.Errorf("sxid without a number: %v", err)
	}
}

// TestKmsgContinuesOnSameRoot: a simulator opened again on the same host
// root appends after the records there, sequence numbers going on.
func TestKmsgContinuesOnSameRoot(t *testing.T) {
	spec, err := Profile("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	n, err := New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.InjectFault(Fault{Kind: FaultXID, GPU: 0, XID: 13}); err != nil {
		t.Fatal(err)
	}
	n2, err := New(spec, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.InjectFault(Fault{Kind: FaultXID, GPU: 1, XID: 43}); err != nil {
		t.Fatal(err)
	}
	if got := kmsgEvents(t, n2); len(got) != 2 || got[0].Code != 13 || got[1].Code != 43 {
		t.Errorf("events %+v, want xid 13 then 43", got)
	}
}

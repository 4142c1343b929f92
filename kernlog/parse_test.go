package kernlog

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// fixtureRecords reads testdata/nvidia.kmsg: real driver lines (each
// record's " SOURCE=" continuation line says where it comes from).
func fixtureRecords(t *testing.T) []Record {
	t.Helper()
	f, err := os.Open("testdata/nvidia.kmsg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, " ") {
			if !strings.HasPrefix(line, " SOURCE=") {
				t.Fatalf("fixture continuation line %q: want SOURCE=", line)
			}
			continue
		}
		rec, err := ParseKmsg([]byte(line + "\n"))
		if err != nil {
			t.Fatalf("fixture record %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

// TestParseFixture: every fixture record gives the event (or none) the
// driver's format says.
func TestParseFixture(t *testing.T) {
	want := map[uint64]Event{
		2:  {Kind: KindXID, BusID: "0000:cb:00", Code: 13, GPUInstance: NoInstance, ComputeInstance: NoInstance, Text: "pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7"},
		4:  {Kind: KindXID, BusID: "0000:06:00", Code: 79, GPUInstance: NoInstance, ComputeInstance: NoInstance, Text: "pid=..., GPU has fallen off the bus."},
		5:  {Kind: KindXID, BusID: "0000:b3:00", Code: 79, GPUInstance: NoInstance, ComputeInstance: NoInstance, Text: "pid=12345, GPU has fallen off the bus."},
		6:  {Kind: KindXID, BusID: "0000:3b:00", Code: 31, GPUInstance: 2, ComputeInstance: 1, Text: "pid=2811, name=python3, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1a_00000000"},
		7:  {Kind: KindXID, BusID: "0000:3b:00", Code: 43, GPUInstance: 5, ComputeInstance: NoInstance, Text: "pid=2812, name=python3, Ch 00000010"},
		8:  {Kind: KindFallenOffBus, BusID: "0000:b3:00"},
		11: {Kind: KindFallenOffBus, BusID: "0000:02:00"},
		12: {Kind: KindFallenOffBus, BusID: "0000:05:00"},
		13: {Kind: KindSXID, BusID: "0000:c3:00", Code: 24007, Switch: 0, Fatal: true, Text: "Fatal, Link 28 sourcetrack timeout error (First)"},
		14: {Kind: KindSXID, BusID: "0000:c1:00", Code: 28006, Switch: 3, Text: "Non-fatal, Link 46 MC TS crumbstore MCTO (First)"},
		15: {Kind: KindSXID, BusID: "0000:c3:00", Code: 12033, Text: "Severity 1 Engine instance 00 Sub-engine instance 00"},
		16: {Kind: KindSXID, BusID: "0004:00:00", Code: 26006, Text: "SOE HALTED"},
	}
	recs := fixtureRecords(t)
	if len(recs) != 17 {
		t.Fatalf("fixture has %d records, want 17", len(recs))
	}
	var p Parser
	for _, rec := range recs {
		got, ok := p.Parse(rec.Message)
		w, want := want[rec.Seq]
		if ok != want {
			t.Errorf("record %d %q: event %v, want one: %v", rec.Seq, rec.Message, ok, want)
			continue
		}
		if !ok {
			continue
		}
		if got.Kind == KindFallenOffBus {
			got.Text = "" // the whole message
		}
		if got != w {
			t.Errorf("record %d %q:\n got %+v\nwant %+v", rec.Seq, rec.Message, got, w)
		}
	}
}

// TestParseKmsgRecord: the header fields and the unescaping of the message.
func TestParseKmsgRecord(t *testing.T) {
	rec, err := ParseKmsg([]byte("3,812,1843308600,-,caller=T1;a\\x0ab\\x5cc\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Priority != 3 || rec.Seq != 812 || rec.Usec != 1843308600 || rec.Message != "a\nb\\c" {
		t.Errorf("record %+v", rec)
	}
	for _, bad := range []string{"no semicolon", "3,x,1,-;m", "3,1;m", "x,1,1,-;m"} {
		if _, err := ParseKmsg([]byte(bad)); err == nil {
			t.Errorf("ParseKmsg(%q): no error", bad)
		}
	}
	// What the simulator writes is what the parser reads back.
	msg := "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: fallen off the bus and is not responding to commands.\\"
	back, err := ParseKmsg([]byte(FormatKmsg(3, 9, 10, msg)))
	if err != nil || back.Message != msg || back.Seq != 9 {
		t.Errorf("FormatKmsg round trip: %+v, %v", back, err)
	}
}

func TestBusIDOf(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00",
		"0000:3b:00.0":     "0000:3b:00",
		"0001:c8:1f.7":     "0001:c8:1f",
		"nonsense":         "",
	} {
		if got := BusIDOf(in); got != want {
			t.Errorf("BusIDOf(%q) = %q, want %q", in, got, want)
		}
	}
}

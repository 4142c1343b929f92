package topology

import "testing"

func TestBusID(t *testing.T) {
	for s, want := range map[string]bool{
		"0000:3b:00.0":     true,
		"0001:ff:1f.7":     true,
		"0000:3B:00.0":     false, // sysfs spells it in lower case
		"0000:3b:00.8":     false, // function 0-7
		"3b:00.0":          false, // no domain
		"0000:3b:00":       false,
		"00000000:3b:00.0": false, // NVML's spelling: NormalizeBusID first
		"":                 false,
	} {
		if got := IsBusID(s); got != want {
			t.Errorf("IsBusID(%q) = %v, want %v", s, got, want)
		}
	}
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		" 0:a:1.2\n":       "0000:0a:01.2",
		"not-a-bus-id":     "not-a-bus-id",
	} {
		got := NormalizeBusID(in)
		if got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
		if IsBusID(got) != (want != "not-a-bus-id") {
			t.Errorf("IsBusID(NormalizeBusID(%q)) = %v", in, IsBusID(got))
		}
	}
}

package sysfsattr

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func write(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "attr")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRead(t *testing.T) {
	long := strings.Repeat("x", 3*short)
	for _, tc := range []struct{ content, want string }{
		{"0x10de\n", "0x10de"},
		{"4: ACTIVE\n", "4: ACTIVE"},
		{"  -1 \n", "-1"},
		{"", ""},
		{strings.Repeat("y", short-1) + "\n", strings.Repeat("y", short-1)},
		{long + "\n", long}, // longer than one read: read whole
		{long[:short], long[:short]},
	} {
		got, err := Read(write(t, tc.content))
		if err != nil || got != tc.want {
			t.Errorf("Read(%.20q... %d bytes) = %.20q... (%d bytes), %v; want %d bytes", tc.content, len(tc.content), got, len(got), err, len(tc.want))
		}
	}
	if _, err := Read(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read(missing) error = %v, want fs.ErrNotExist", err)
	}
	if _, err := Read(t.TempDir()); err == nil {
		t.Error("Read(a directory) = nil error")
	}
}

func TestHex(t *testing.T) {
	for content, want := range map[string]uint64{"0x10de\n": 0x10de, "0x030200\n": 0x030200, "15b3": 0x15b3} {
		if got, err := Hex(write(t, content)); err != nil || got != want {
			t.Errorf("Hex(%q) = %#x, %v; want %#x", content, got, err, want)
		}
	}
	p := write(t, "0xzz\n")
	_, err := Hex(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), `"0xzz"`) {
		t.Errorf("Hex(0xzz) error = %v, want one naming %s and the value", err, p)
	}
	if _, err := Hex(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Hex(missing) error = %v, want fs.ErrNotExist", err)
	}
}

// allocated returns the bytes f allocates on average over n calls.
func allocated(n int, f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		f()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(n)
}

// TestReadAllocatesLittle reads a real sysfs attribute, which reports the
// 4096-byte size every attribute has: os.ReadFile allocates more than that
// for it, Read a few hundred bytes (the open file and the value).
func TestReadAllocatesLittle(t *testing.T) {
	const attr = "/sys/devices/system/cpu/online"
	want, err := os.ReadFile(attr)
	if err != nil {
		t.Skipf("no sysfs here: %v", err)
	}
	got, err := Read(attr)
	if err != nil || got != strings.TrimSpace(string(want)) {
		t.Fatalf("Read(%s) = %q, %v; want %q", attr, got, err, strings.TrimSpace(string(want)))
	}
	readFile := allocated(100, func() { _, _ = os.ReadFile(attr) })
	read := allocated(100, func() { _, _ = Read(attr) })
	t.Logf("bytes allocated per read of %s: os.ReadFile %d, Read %d", attr, readFile, read)
	if readFile < 4096 {
		t.Fatalf("os.ReadFile allocates %d bytes for %s, want the sysfs size (4096) or more", readFile, attr)
	}
	if read > 1024 {
		t.Errorf("Read allocates %d bytes for %s, want at most 1024", read, attr)
	}
}

// Package sysfsattr reads sysfs attributes: the small text files the
// kernel writes afresh on each read(2), such as a PCI function's vendor
// and class, a NUMA node or an InfiniBand port's state.
//
// sysfs gives every attribute a size of 4096 bytes, so os.ReadFile
// allocates over 4 KiB to read "0x10de\n" (5,208 bytes, its test finds).
// The agent reads the vendor and class of each of the hundreds of PCI
// functions of a GPU node on every rescan and each RDMA port's state on
// every poll: megabytes of garbage a minute that way. Read allocates the
// value and little more.
package sysfsattr

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// short is what Read's one read(2) takes. Every attribute the agent reads
// is shorter; a longer one is read whole.
const short = 128

// Read returns the attribute at path, white space around it removed.
func Read(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var buf [short]byte
	n, err := f.Read(buf[:])
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	if n == len(buf) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// Hex returns a hexadecimal attribute ("0x10de", "0x030200", "15b3").
func Hex(path string) (uint64, error) {
	s, err := Read(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a hexadecimal number", path, s)
	}
	return v, nil
}

// Command workload is the e2e test pods' image: it prints its environment
// (one VAR=value per line, sorted) and the device nodes under
// /dev/infiniband, the /dev/nvidia* nodes and those under /dev/nvidia-caps
// (one "DEVICE path type major:minor mode" line each), and the DRA device
// metadata files under /var/run/kubernetes.io/dra-device-attributes (one
// "METADATA path JSON" line each), so tests can read what the
// container was given from its log, then waits until it is terminated.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println(kv)
	}
	fmt.Println("--- end of environment")
	printDevices("/dev/infiniband", "")
	printDevices("/dev", "nvidia")
	printDevices("/dev/nvidia-caps", "")
	fmt.Println("--- end of devices")
	printMetadata("/var/run/kubernetes.io/dra-device-attributes")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
}

// printDevices lists dir's entries whose names start with prefix, but
// directories, as the container sees them; a missing dir lists nothing.
func printDevices(dir, prefix string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !os.IsNotExist(err) {
			fmt.Printf("DEVICE-ERROR %s: %v\n", dir, err)
		}
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			fmt.Printf("DEVICE-ERROR %s: %v\n", path, err)
			continue
		}
		kind := "other"
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFCHR:
			kind = "char"
		case unix.S_IFREG:
			kind = "file"
		}
		fmt.Printf("DEVICE %s %s %d:%d %o\n", path, kind, unix.Major(st.Rdev), unix.Minor(st.Rdev), st.Mode&0o777)
	}
}

// printMetadata prints each file under dir with the first JSON value of
// its content (the newest version's object of a metadata JSON stream),
// compacted onto the line; a missing dir prints nothing.
func printMetadata(dir string) {
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var first json.RawMessage
		var line bytes.Buffer
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&first); err != nil {
			fmt.Printf("METADATA-ERROR %s: %v\n", path, err)
			return nil
		}
		if err := json.Compact(&line, first); err != nil {
			fmt.Printf("METADATA-ERROR %s: %v\n", path, err)
			return nil
		}
		fmt.Printf("METADATA %s %s\n", path, line.String())
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		fmt.Printf("METADATA-ERROR %s: %v\n", dir, err)
	}
}

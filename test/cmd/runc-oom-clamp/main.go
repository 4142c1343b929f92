// Command runc-oom-clamp runs runc with every negative process.oomScoreAdj
// in the bundle's config.json raised to 0. The e2e cluster uses it only
// where the test environment lacks CAP_SYS_RESOURCE (some sandboxed CI
// containers), without which runc cannot give the pod sandbox the -998 the
// kubelet asks for and every pod fails with "can't get final child's PID
// from pipe". Everything else is runc's own behaviour.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// runcPath is the real runc; set with -ldflags "-X main.runcPath=...".
var runcPath = "/usr/sbin/runc"

func main() {
	args := os.Args[1:]
	if bundle, ok := bundleDir(args); ok {
		if err := clamp(filepath.Join(bundle, "config.json")); err != nil {
			fmt.Fprintf(os.Stderr, "runc-oom-clamp: %v\n", err)
			os.Exit(1)
		}
	}
	err := syscall.Exec(runcPath, append([]string{runcPath}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "runc-oom-clamp: exec %s: %v\n", runcPath, err)
	os.Exit(1)
}

// bundleDir returns the --bundle of a create or run command.
func bundleDir(args []string) (string, bool) {
	create := false
	for i, a := range args {
		switch {
		case a == "create" || a == "run":
			create = true
		case create && (a == "--bundle" || a == "-b") && i+1 < len(args):
			return args[i+1], true
		case create && strings.HasPrefix(a, "--bundle="):
			return strings.TrimPrefix(a, "--bundle="), true
		}
	}
	return "", false
}

// clamp rewrites config.json's process.oomScoreAdj to 0 when negative,
// keeping every other field as it was.
func clamp(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read bundle config: %w", err)
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("decode %s: %w", path, err)
	}
	var proc map[string]json.RawMessage
	if err := json.Unmarshal(spec["process"], &proc); err != nil {
		return fmt.Errorf("decode %s process: %w", path, err)
	}
	var adj int
	if raw, ok := proc["oomScoreAdj"]; !ok || json.Unmarshal(raw, &adj) != nil || adj >= 0 {
		return nil
	}
	proc["oomScoreAdj"] = json.RawMessage("0")
	if spec["process"], err = json.Marshal(proc); err != nil {
		return fmt.Errorf("encode process: %w", err)
	}
	out, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o600)
}

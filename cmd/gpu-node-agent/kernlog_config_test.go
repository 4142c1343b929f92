//go:build simulator

package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigKernelLog: health.kernelLog is read from the config file (an
// unquoted off, a YAML 1.1 boolean, included) and a value that is no mode
// is a config error naming the key.
func TestConfigKernelLog(t *testing.T) {
	for _, tc := range []struct{ yaml, want, wantErr string }{
		{yaml: "health:\n  kernelLog: off\n", want: "off"},
		{yaml: "health:\n  kernelLog: journal\n", want: "journal"},
		{yaml: "health:\n  kernelLog: syslog\n", want: "syslog"},
		{yaml: "health:\n  kernelLog: dmesg\n", wantErr: `health.kernelLog "dmesg": must be auto, kmsg, syslog, journal or off`},
	} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(tc.yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig([]string{"--config", path, "--simulate", "dgx-h100"}, env(nil), io.Discard)
		if err == nil {
			err = c.Validate()
		}
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want one containing %q", tc.yaml, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.yaml, err)
			continue
		}
		if c.Health.KernelLog != tc.want {
			t.Errorf("%q: kernelLog %q, want %q", tc.yaml, c.Health.KernelLog, tc.want)
		}
	}
}

package preflight

import (
	"fmt"
	"strconv"
	"strings"
)

// checkDriver: the driver NVML reports (nvmlSystemGetDriverVersion) is at
// least driver.minVersion.
func checkDriver(cfg Config, in *Inputs) Result {
	r := Result{Item: ItemDriverVersion, Target: "node"}
	min := cfg.Driver.MinVersion
	switch {
	case in.Node == nil:
		r.Status, r.Detail = Fail, "driver version unknown: NVML unavailable"
		return r
	case min == "":
		r.Status, r.Detail = Skipped, fmt.Sprintf("driver %s; no minimum configured (preflight.driver.minVersion)", orUnknown(in.Node.Host.DriverVersion))
		return r
	}
	have := in.Node.Host.DriverVersion
	hv, err := parseVersion(have)
	if err != nil {
		r.Status, r.Detail = Fail, fmt.Sprintf("driver version unknown (%v), want at least %s", err, min)
		return r
	}
	mv, _ := parseVersion(min) // Validate checked it
	if compareVersions(hv, mv) < 0 {
		r.Status, r.Detail = Fail, fmt.Sprintf("driver %s, want at least %s", have, min)
		return r
	}
	r.Status, r.Detail = Pass, fmt.Sprintf("driver %s, at least %s", have, min)
	return r
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// parseVersion reads an NVIDIA driver version: numbers separated by dots
// ("550.54.15", "570.172.08", "418.87.01").
func parseVersion(v string) ([]uint64, error) {
	parts := strings.Split(strings.TrimSpace(v), ".")
	out := make([]uint64, len(parts))
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q is not a driver version such as 550.54.15", v)
		}
		out[i] = n
	}
	return out, nil
}

// compareVersions compares number by number; a missing number is 0
// ("550.54" = "550.54.0").
func compareVersions(a, b []uint64) int {
	for i := range max(len(a), len(b)) {
		var x, y uint64
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		switch {
		case x < y:
			return -1
		case x > y:
			return 1
		}
	}
	return 0
}

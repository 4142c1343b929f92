package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// TaintKey is the key of the device taint an unhealthy device carries: the
// key the agent's Node taint uses, now on the device.
const TaintKey = "gpu-node-agent.io/unhealthy"

// Fault is why the health monitor finds a device unfit, as Build turns it
// into a device taint.
type Fault struct {
	// Cause is a short code naming the fault ("xid-79", "gpu-lost",
	// "nvml"); it becomes the taint's value, made a valid label value.
	Cause string
	// Effect is the taint's effect; empty means NoSchedule. NoExecute is
	// for node-wide faults when configured (a later step decides when).
	Effect resourceapi.DeviceTaintEffect
}

// taint is the device taint for f. TimeAdded is left to the API server
// (it sets it on create and update), so the same fault builds the same
// device and a slice is not rewritten for it.
func (f Fault) taint() resourceapi.DeviceTaint {
	effect := f.Effect
	if effect == "" {
		effect = resourceapi.DeviceTaintEffectNoSchedule
	}
	return resourceapi.DeviceTaint{Key: TaintKey, Value: labelValue(f.Cause), Effect: effect}
}

// labelValue makes s a valid label value: characters other than
// alphanumerics, "-", "_" and "." become "-", at most 63 characters, and
// beginning and ending with an alphanumeric; "unknown" when nothing is
// left.
func labelValue(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	out := strings.TrimFunc(string(b), func(r rune) bool { return r == '-' || r == '_' || r == '.' })
	if out == "" {
		return "unknown"
	}
	return out
}

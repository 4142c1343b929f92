package compare

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
)

// Tolerance says when the agent's and nvidia-smi's readings of a value
// agree. The kit reads nvidia-smi first and the agent about a second
// later, so readings that move get room; identities and settings do not.
type Tolerance struct {
	// Name is printed with every comparison.
	Name string
	OK   func(agent, smi float64) bool
}

var (
	// Exact: identities, settings and sizes.
	Exact = Tolerance{"exact", func(a, s float64) bool { return a == s }}
	// Temperature moves a few degrees between the readings.
	Temperature = Tolerance{"within 5 C", func(a, s float64) bool { return math.Abs(a-s) <= 5 }}
	// Power follows the load: 25 % of the larger reading or 20 W,
	// whichever is more.
	Power = Tolerance{"within 25 % or 20 W", func(a, s float64) bool {
		return math.Abs(a-s) <= max(0.25*max(a, s), 20)
	}}
	// Clock follows load and power state: loose, 50 % of the larger
	// reading or 100 MHz, whichever is more.
	Clock = Tolerance{"loose: within 50 % or 100 MHz", func(a, s float64) bool {
		return math.Abs(a-s) <= max(0.5*max(a, s), 100)
	}}
	// Grows is for counters: the agent read after nvidia-smi, so its
	// count may be higher, never lower.
	Grows = Tolerance{"a counter: the agent's later reading may only be higher", func(a, s float64) bool { return a >= s }}
)

// MemoryUsed is loose: processes come and go between the readings; 10 %
// of the GPU's memory or 1024 MiB, whichever is more.
func MemoryUsed(totalMiB float64) Tolerance {
	return Tolerance{"loose: within 10 % of the total or 1024 MiB", func(a, s float64) bool {
		return math.Abs(a-s) <= max(0.1*totalMiB, 1024)
	}}
}

// LinkGeneration is loose: an idle GPU's link trains down to a lower
// generation, so either reading may be anything from 1 to the maximum.
func LinkGeneration(maxGen float64) Tolerance {
	return Tolerance{fmt.Sprintf("loose: 1 to the maximum, %g: the link trains down at idle", maxGen), func(a, s float64) bool {
		return a >= 1 && s >= 1 && a <= maxGen && s <= maxGen
	}}
}

// reading is one side's value of a number, or why it has none.
type reading struct {
	v   float64
	why string
}

// smiReading reads an nvidia-smi number with its unit ("" for a count).
func smiReading(s, unit string) reading {
	var f float64
	var ok bool
	if unit == "" {
		var n uint64
		n, ok = nvsmi.Uint(s)
		f = float64(n)
	} else {
		f, ok = nvsmi.Float(s, unit)
	}
	if !ok {
		return reading{why: "nvidia-smi: " + nvsmi.Missing(s)}
	}
	return reading{v: f}
}

// value is one side's value of a string, or why it has none.
type value struct {
	v   string
	why string
}

// notValues are what nvidia-smi writes instead of a value.
var notValues = []string{
	nvsmi.NA, "[N/A]", "Not Supported", "[Not Supported]", "Insufficient Permissions", "Unknown Error",
	"GPU is lost", "Requested functionality has been deprecated",
}

// smiValue is an nvidia-smi string, or why there is none.
func smiValue(s string) value {
	s = strings.TrimSpace(s)
	for _, n := range notValues {
		if s == n {
			return value{why: "nvidia-smi: " + s}
		}
	}
	if s == "" {
		return value{why: "nvidia-smi: no element"}
	}
	return value{v: s}
}

// smiState is an nvidia-smi Enabled/Disabled or Yes/No, spelt as
// nvidia-smi spells it.
func smiState(s string) value {
	if _, ok := nvsmi.Enabled(s); !ok {
		return value{why: "nvidia-smi: " + nvsmi.Missing(s)}
	}
	return value{v: strings.TrimSpace(s)}
}

// state is nvidia-smi's word for a mode: Enabled or Disabled.
func state(on bool) string {
	if on {
		return "Enabled"
	}
	return "Disabled"
}

// yesNo is nvidia-smi's word for a condition: Yes or No.
func yesNo(on bool) string {
	if on {
		return "Yes"
	}
	return "No"
}

func formatNum(v float64, unit string) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	switch unit {
	case "":
		return s
	case "x":
		// A link width, as nvidia-smi writes it: "16x".
		return s + unit
	}
	return s + " " + unit
}

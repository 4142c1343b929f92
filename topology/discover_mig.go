package topology

import (
	"fmt"
	"math"
	"strings"
)

// MIGProfileName returns the canonical MIG profile name NVIDIA's tools use
// ("1g.10gb", "1c.3g.40gb", "1g.10gb+me"). giSlices and ciSlices are the GPU
// and compute instance slice counts, migMemoryMiB the GPU instance memory,
// parentMemoryBytes the parent GPU's total memory and attrs profile
// attributes such as "me" (media extensions).
//
// The memory figure is not the MIG memory rounded up: like go-nvlib it is the
// fraction of the parent's memory, rounded up to eighths, times the parent's
// memory in whole GiB, so a 4864 MiB slice of a 40 GiB A100 is "5gb".
func MIGProfileName(giSlices, ciSlices int, migMemoryMiB, parentMemoryBytes uint64, attrs ...string) string {
	gb := migMemoryGB(migMemoryMiB, parentMemoryBytes)
	var suffix string
	if len(attrs) > 0 {
		suffix = "+" + strings.Join(attrs, ",")
	}
	if ciSlices == 0 || ciSlices == giSlices {
		return fmt.Sprintf("%dg.%dgb%s", giSlices, gb, suffix)
	}
	return fmt.Sprintf("%dc.%dg.%dgb%s", ciSlices, giSlices, gb, suffix)
}

func migMemoryGB(migMemoryMiB, parentMemoryBytes uint64) uint64 {
	const (
		mib    = 1 << 20
		gib    = 1 << 30
		eighth = 8
	)
	if parentMemoryBytes == 0 {
		// Without the parent's size the best we can do is round up.
		return (migMemoryMiB + 1023) / 1024
	}
	frac := float64(migMemoryMiB) * mib / float64(parentMemoryBytes)
	frac = math.Ceil(frac*eighth) / eighth
	totalGB := float64((parentMemoryBytes + gib - 1) / gib)
	return uint64(math.Round(frac * totalGB))
}

package gpu

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
)

// migMinorsPath is where the NVIDIA driver lists the device minor of each
// MIG capability; /dev/nvidia-caps/nvidia-cap<minor> is its device node.
const migMinorsPath = "/proc/driver/nvidia-caps/mig-minors"

// migCaps maps capability keys as the driver writes them
// ("gpu<minor>/gi<gi>/access", "gpu<minor>/gi<gi>/ci<ci>/access") to the
// minor of their /dev/nvidia-caps node.
type migCaps struct {
	minors map[string]int
	// err is why the file could not be read; it only matters to Allocate
	// with device specs for a MIG device, so it is kept, not returned.
	err error
}

// loadMIGCaps reads mig-minors under hostRoot. A node without MIG support
// has no such file; that is reported only when a MIG device needs it.
func loadMIGCaps(hostRoot string) migCaps {
	f, err := os.Open(filepath.Join(hostRoot, migMinorsPath))
	if err != nil {
		return migCaps{err: err}
	}
	defer f.Close()

	caps := migCaps{minors: map[string]int{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var key string
		var minor int
		// Lines look like "gpu0/gi1/ci0/access 12"; config and monitor
		// lines parse too and are simply never looked up.
		if n, _ := fmt.Sscanf(sc.Text(), "%s %d", &key, &minor); n == 2 {
			caps.minors[key] = minor
		}
	}
	if err := sc.Err(); err != nil {
		caps.err = err
	}
	return caps
}

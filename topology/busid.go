package topology

import (
	"fmt"
	"strings"
)

// NormalizeBusID turns an NVML or sysfs spelling of a PCI address
// ("00000000:0A:00.0", "0000:0a:00.0") into "0000:0a:00.0"; strings that do
// not parse are returned lower-cased.
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	var dom, bus, dev, fn uint64
	if _, err := fmt.Sscanf(s, "%x:%x:%x.%x", &dom, &bus, &dev, &fn); err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dev, fn)
}

// LostGPUID is the device ID of GPU index i when NVML could not report its
// UUID (the GPU was lost before it could be read). It is stable across
// rediscoveries while the GPU stays lost.
func LostGPUID(i int) string { return fmt.Sprintf("GPU-lost-index-%d", i) }

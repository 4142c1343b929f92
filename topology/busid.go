package topology

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
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

// IsBusID says whether s is a PCI address as sysfs spells it
// ("0000:3b:00.0": domain, bus, device and function, lower case).
func IsBusID(s string) bool { return busIDPattern().MatchString(s) }

// busIDPattern compiles on first use, as every pattern of the agent's:
// a pattern compiled at init is heap and code paged in by every agent,
// whether or not it ever checks one.
var busIDPattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
})

// LostGPUID is the device ID of GPU index i when NVML could not report its
// UUID (the GPU was lost before it could be read). It is stable across
// rediscoveries while the GPU stays lost.
func LostGPUID(i int) string { return fmt.Sprintf("GPU-lost-index-%d", i) }

package plugin

import (
	"fmt"
)

// checkPreferredRequest rejects a preferred-allocation request the kubelet
// should never send: an impossible size, IDs we do not serve, repeats, or
// must-include IDs that are not available.
func checkPreferredRequest(devs *deviceList, available, mustInclude []string, size int) error {
	if size < 1 || size > len(available) {
		return fmt.Errorf("allocation size %d outside 1..%d available devices", size, len(available))
	}
	if len(mustInclude) > size {
		return fmt.Errorf("%d must-include devices exceed allocation size %d", len(mustInclude), size)
	}
	avail := make(map[string]bool, len(available))
	for _, id := range available {
		if _, ok := devs.byID[id]; !ok {
			return fmt.Errorf("unknown available device %q", id)
		}
		if avail[id] {
			return fmt.Errorf("available device %q listed more than once", id)
		}
		avail[id] = true
	}
	seen := make(map[string]bool, len(mustInclude))
	for _, id := range mustInclude {
		if _, ok := devs.byID[id]; !ok {
			return fmt.Errorf("unknown must-include device %q", id)
		}
		if !avail[id] {
			return fmt.Errorf("must-include device %q is not available", id)
		}
		if seen[id] {
			return fmt.Errorf("must-include device %q listed more than once", id)
		}
		seen[id] = true
	}
	return nil
}

// checkPreferredAnswer holds a PreferredAllocator to its contract: exactly
// size distinct available IDs including every must-include one.
func checkPreferredAnswer(ids, available, mustInclude []string, size int) error {
	if len(ids) != size {
		return fmt.Errorf("allocator returned %d devices, want %d", len(ids), size)
	}
	avail := make(map[string]bool, len(available))
	for _, id := range available {
		avail[id] = true
	}
	got := make(map[string]bool, len(ids))
	for _, id := range ids {
		if !avail[id] {
			return fmt.Errorf("allocator returned device %q that is not available", id)
		}
		if got[id] {
			return fmt.Errorf("allocator returned device %q twice", id)
		}
		got[id] = true
	}
	for _, id := range mustInclude {
		if !got[id] {
			return fmt.Errorf("allocator left out must-include device %q", id)
		}
	}
	return nil
}

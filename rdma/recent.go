package rdma

import (
	"slices"
	"sync"
	"time"
)

// DefaultRecentTTL is how long a recorded GPU allocation counts as the
// current container's. The kubelet allocates one container's resources
// back to back (GetPreferredAllocation then Allocate, resource by
// resource), so a couple of seconds covers it without leaking into the
// next pod.
const DefaultRecentTTL = 2 * time.Second

// Recent implements RecentGPUs: the GPU resource calls Record from its
// Allocate, the RDMA resource reads it in PreferredAllocation. The kubelet
// walks a container's resources in map order, so the GPUs come first only
// some of the time; otherwise PreferredAllocation falls back to NIC-to-NIC
// closeness.
type Recent struct {
	ttl time.Duration
	now func() time.Time

	mu   sync.Mutex
	ids  []string
	when time.Time
}

// NewRecent returns a Recent whose records expire after ttl (0 means
// DefaultRecentTTL).
func NewRecent(ttl time.Duration) *Recent {
	if ttl <= 0 {
		ttl = DefaultRecentTTL
	}
	return &Recent{ttl: ttl, now: time.Now}
}

// Record notes the GPU UUIDs just allocated to a container.
func (r *Recent) Record(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = slices.Clone(ids)
	r.when = r.now()
}

// RecentAllocation implements RecentGPUs.
func (r *Recent) RecentAllocation() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil || r.now().Sub(r.when) > r.ttl {
		return nil
	}
	return slices.Clone(r.ids)
}

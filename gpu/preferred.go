package gpu

import (
	"cmp"
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// preferredResource is a GPU or MIG resource that can choose devices: with
// a topology solver behind it, or serving replicas. It is a separate type
// so that the plugin server, which finds optional hooks by interface
// assertion, advertises GetPreferredAllocation only when it can answer.
type preferredResource struct {
	*resource
	// solver chooses among whole devices; nil when there is none.
	solver PreferredSolver
}

var _ plugin.PreferredAllocator = (*preferredResource)(nil)

// PreferredAllocation chooses size devices out of the healthy ones in
// available (plus every mustInclude, healthy or not). When any of them is a
// replica the choice spreads over the shared devices (see spread), as
// NVIDIA's plugin does for replicas (internal/rm/nvml_manager.go
// getPreferredAllocation: an aligned allocation only when no available ID
// is a replica); otherwise the topology solver chooses. The plugin server
// has already checked the request (known, distinct IDs; must-include ones
// available; a possible size) and checks the answer against available
// (size distinct IDs including every must-include one), so only what it
// cannot know is checked here: that enough healthy devices are left, and
// that the solver chose none of the unhealthy ones it was not offered.
func (r *preferredResource) PreferredAllocation(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	offer := make([]string, 0, len(available))
	replicas := false
	for _, id := range available {
		d, ok := r.byID[id]
		if (ok && r.healthy(d)) || slices.Contains(mustInclude, id) {
			offer = append(offer, id)
			replicas = replicas || (ok && d.replicas > 0)
		}
	}
	if size > len(offer) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: cannot choose %d devices from %d healthy available with %d required", r.name, size, len(offer), len(mustInclude))
	}
	if replicas || r.solver == nil {
		return r.spread(offer, mustInclude, size), nil
	}

	got, err := r.solver.Preferred(offer, mustInclude, size)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: preferred allocation: %v", r.name, err)
	}
	for _, id := range got {
		if !slices.Contains(offer, id) {
			return nil, status.Errorf(codes.Internal, "%s: solver chose device %q, which was not offered (unhealthy or not available)", r.name, id)
		}
	}
	return got, nil
}

// spread chooses size devices out of offer, every mustInclude first, one
// at a time: each time a replica of the shared device this request holds
// the fewest of, so a request gets as many distinct GPUs (or MIG devices)
// as have a replica on offer; among those, the device whose replicas other
// containers hold the most of the fewest (the least loaded, NVIDIA's
// "distributed" policy, internal/rm/allocate.go); then the first in NVML
// order, and its lowest replica. When the request is larger than the
// devices on offer it wraps round: the replicas are spread as evenly as
// possible (no device gets a second one before every device has one).
// NVLink distance is not considered: replicas share a GPU's time, and a
// job that needs linked GPUs asks for whole ones. A device that is not a
// replica counts as a device with one replica.
func (r *preferredResource) spread(offer, mustInclude []string, size int) []string {
	type group struct {
		order   int // position of the device's first ID in the resource
		free    int // its replicas on offer
		total   int // its replicas in the resource
		request int // its replicas in this request so far
	}
	groups := map[string]*group{}
	pos := make(map[string]int, len(r.devices))
	for i, d := range r.devices {
		pos[d.id] = i
		g := groups[d.uuid]
		if g == nil {
			g = &group{order: i}
			groups[d.uuid] = g
		}
		g.total++
	}
	// Unknown IDs cannot be on offer (the plugin server checks), but an
	// unknown one must not be chosen from a nil group either.
	known := func(id string) *group {
		if d, ok := r.byID[id]; ok {
			return groups[d.uuid]
		}
		return nil
	}
	for _, id := range offer {
		if g := known(id); g != nil {
			g.free++
		}
	}
	out := slices.Clone(mustInclude)
	for _, id := range mustInclude {
		if g := known(id); g != nil {
			g.request++
		}
	}
	var candidates []string
	for _, id := range offer {
		if !slices.Contains(mustInclude, id) && known(id) != nil {
			candidates = append(candidates, id)
		}
	}
	// held is how many of a device's replicas neither this request nor
	// the offer has: what other containers hold (or unhealthy ones).
	held := func(g *group) int { return g.total - g.free }
	less := func(a, b string) int {
		ga, gb := known(a), known(b)
		return cmp.Or(
			cmp.Compare(ga.request, gb.request),
			cmp.Compare(held(ga), held(gb)),
			cmp.Compare(ga.order, gb.order),
			cmp.Compare(pos[a], pos[b]),
		)
	}
	for len(out) < size && len(candidates) > 0 {
		best := slices.MinFunc(candidates, less)
		known(best).request++
		out = append(out, best)
		candidates = slices.DeleteFunc(candidates, func(id string) bool { return id == best })
	}
	return out
}

package gpu

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// preferredResource is a GPU or MIG resource with a topology solver behind
// it. It is a separate type so that the plugin server, which finds optional
// hooks by interface assertion, advertises GetPreferredAllocation only when
// a solver exists.
type preferredResource struct {
	*resource
	solver PreferredSolver
}

var _ plugin.PreferredAllocator = (*preferredResource)(nil)

// PreferredAllocation asks the solver for size GPUs out of the healthy ones
// in available (plus every mustInclude, healthy or not). The plugin server
// has already checked the request (known, distinct IDs; must-include ones
// available; a possible size) and checks the answer against available
// (size distinct IDs including every must-include one), so only what it
// cannot know is checked here: that enough healthy devices are left, and
// that the solver chose none of the unhealthy ones it was not offered.
func (r *preferredResource) PreferredAllocation(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	offer := make([]string, 0, len(available))
	for _, id := range available {
		if d, ok := r.byID[id]; (ok && r.healthy(d)) || slices.Contains(mustInclude, id) {
			offer = append(offer, id)
		}
	}
	if size > len(offer) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: cannot choose %d devices from %d healthy available with %d required", r.name, size, len(offer), len(mustInclude))
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

package gpu

import (
	"context"
	"fmt"
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
// in available (plus every mustInclude), and checks its answer.
func (r *preferredResource) PreferredAllocation(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	offer := make([]string, 0, len(available))
	for _, id := range available {
		d, ok := r.byID[id]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device %q", r.name, id)
		}
		if r.healthy(d) || slices.Contains(mustInclude, id) {
			offer = append(offer, id)
		}
	}
	for _, id := range mustInclude {
		if !slices.Contains(available, id) {
			return nil, status.Errorf(codes.InvalidArgument, "%s: must-include device %q is not available", r.name, id)
		}
	}
	if size < len(mustInclude) || size > len(offer) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: cannot choose %d devices from %d healthy available with %d required", r.name, size, len(offer), len(mustInclude))
	}

	got, err := r.solver.Preferred(offer, mustInclude, size)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "%s: preferred allocation: %v", r.name, err)
	}
	if err := checkChoice(got, offer, mustInclude, size); err != nil {
		return nil, status.Errorf(codes.Internal, "%s: solver answer: %v", r.name, err)
	}
	return got, nil
}

// checkChoice guards the kubelet against a solver bug: the answer must be
// size distinct offered IDs including every required one.
func checkChoice(got, offer, mustInclude []string, size int) error {
	if len(got) != size {
		return fmt.Errorf("got %d devices, want %d", len(got), size)
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			return fmt.Errorf("device %q chosen twice", id)
		}
		seen[id] = true
		if !slices.Contains(offer, id) {
			return fmt.Errorf("device %q was not offered", id)
		}
	}
	for _, id := range mustInclude {
		if !seen[id] {
			return fmt.Errorf("required device %q left out", id)
		}
	}
	return nil
}

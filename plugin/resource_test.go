package plugin

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fakeResource is an immutable Resource: tests Sync a new value to change it.
type fakeResource struct {
	name     string
	devs     []Device
	allocErr error
}

func (r *fakeResource) Name() string      { return r.name }
func (r *fakeResource) Devices() []Device { return slices.Clone(r.devs) }

func (r *fakeResource) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if r.allocErr != nil {
		return nil, r.allocErr
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"FAKE_DEVICES": strings.Join(ids, ",")}}, nil
}

// preferredResource adds a PreferredAllocator whose answer the test chooses.
type preferredResource struct {
	*fakeResource
	prefer func(available, mustInclude []string, size int) ([]string, error)
}

func (r *preferredResource) PreferredAllocation(_ context.Context, available, mustInclude []string, size int) ([]string, error) {
	return r.prefer(available, mustInclude, size)
}

// preStartResource records PreStart calls.
type preStartResource struct {
	*fakeResource
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (r *preStartResource) PreStart(_ context.Context, ids []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, ids)
	return r.err
}

// bothResource has both optional hooks.
type bothResource struct {
	*preferredResource
	*preStartResource
}

func (b *bothResource) Name() string      { return b.preferredResource.Name() }
func (b *bothResource) Devices() []Device { return b.preferredResource.Devices() }
func (b *bothResource) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	return b.preferredResource.Allocate(ctx, ids)
}

// gpus returns n healthy devices "GPU-0".."GPU-n-1", half on NUMA node 0 and
// half on node 1.
func gpus(n int) []Device {
	out := make([]Device, n)
	for i := range out {
		out[i] = Device{ID: "GPU-" + strconv.Itoa(i), Healthy: true, NUMANodes: []int64{int64(i * 2 / n)}}
	}
	return out
}

// firstN is a well-behaved preferred allocator: must-include first, then the
// available devices in order.
func firstN(available, mustInclude []string, size int) ([]string, error) {
	out := slices.Clone(mustInclude)
	for _, id := range available {
		if len(out) == size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out, nil
}

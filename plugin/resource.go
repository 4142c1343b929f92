// Package plugin is a resource-agnostic kubelet device-plugin server: one gRPC
// server per resource, registration with the kubelet (again whenever
// kubelet.sock is re-created), and device-list pushes to every ListAndWatch
// stream. It knows nothing of GPUs or NICs; those are Resources.
package plugin

import (
	"context"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one allocatable unit of a resource as the kubelet sees it.
type Device struct {
	// ID is what the kubelet allocates by (a GPU UUID, a MIG UUID, an RDMA
	// device name or slot).
	ID      string
	Healthy bool
	// NUMANodes is the device's NUMA affinity; empty means none.
	NUMANodes []int64
}

// Resource is one extended resource (e.g. "nvidia.com/gpu"). Implementations
// must be safe for concurrent use; Devices is called on every sync and must
// be cheap (no hardware access).
type Resource interface {
	// Name is the full resource name, e.g. "nvidia.com/mig-1g.10gb".
	Name() string
	// Devices is the current device list.
	Devices() []Device
	// Allocate builds the response for one container. The server has
	// already checked that every ID is known and none repeats.
	Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

// PreferredAllocator is implemented by resources that can choose the best
// set of devices; the server advertises GetPreferredAllocationAvailable only
// for them.
type PreferredAllocator interface {
	// PreferredAllocation returns exactly size device IDs from available,
	// including every mustInclude ID.
	PreferredAllocation(ctx context.Context, available, mustInclude []string, size int) ([]string, error)
}

// PreStarter is implemented by resources that need a hook before a
// container starts; the server advertises PreStartRequired only for them.
type PreStarter interface {
	PreStart(ctx context.Context, ids []string) error
}

package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
)

// Paths and names the NVIDIA container stack agrees on.
const (
	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
	// volumeMountsRoot is where the NVIDIA container runtime looks for one
	// (empty) mount per device under the volume-mounts strategy.
	volumeMountsRoot = "/var/run/nvidia-container-devices"
	cdiVendor        = "nvidia.com"
	cdiClass         = "gpu"
)

// controlNodes are the driver's shared device nodes every CUDA process
// needs, passed with device specs when they exist.
var controlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// device is one allocatable GPU or MIG device, or one time-sliced replica
// of one.
type device struct {
	// id is the kubelet's device ID: uuid, or "<uuid>::<n>" for replica n.
	id string
	// uuid is the GPU or MIG device a container allocated id gets.
	uuid string
	// index is NVIDIA's device index: the GPU's NVML index ("3"), or for
	// a MIG device its GPU's and its own MIG handle index ("3:1").
	index string
	// replicas is how many replicas of uuid the resource serves (0: uuid
	// is not shared).
	replicas int
	// gpu is the UUID of the physical GPU: the device itself or its parent.
	gpu  string
	numa []int64
	// healthIDs must all be healthy: the device itself and, for MIG, its
	// parent GPU, since a sick parent takes every slice down with it.
	healthIDs []string
	lost      bool
	// nodes are the /dev paths (as the host sees them) the device needs:
	// its GPU's /dev/nvidiaN and, for MIG, the GI and CI capability nodes.
	nodes []string
	// capsErr says why a MIG device's capability nodes are unknown.
	capsErr error
}

// resource is one GPU or MIG resource; immutable after construction, so it
// is safe for concurrent use. A new one is built on every rediscovery.
type resource struct {
	name    string
	devices []device
	byID    map[string]*device
	cfg     Config
	health  HealthView
}

var _ plugin.Resource = (*resource)(nil)

func newResource(name string, devs []device, cfg Config, health HealthView) *resource {
	r := &resource{name: name, devices: devs, byID: make(map[string]*device, len(devs)), cfg: cfg, health: health}
	for i := range r.devices {
		r.byID[r.devices[i].id] = &r.devices[i]
	}
	return r
}

// Name is the full resource name, e.g. nvidia.com/mig-1g.10gb.
func (r *resource) Name() string { return r.name }

// Devices is the device list with current health.
func (r *resource) Devices() []plugin.Device {
	out := make([]plugin.Device, len(r.devices))
	for i := range r.devices {
		d := &r.devices[i]
		out[i] = plugin.Device{ID: d.id, Healthy: r.healthy(d), NUMANodes: d.numa}
	}
	return out
}

func (r *resource) healthy(d *device) bool {
	if d.lost {
		return false
	}
	for _, id := range d.healthIDs {
		if !r.health.Healthy(id) {
			return false
		}
	}
	return true
}

// Allocate builds the container response for ids under the configured
// device-list strategy, with device specs when asked for. Replicas are
// mapped to the device they share, each device named once (two replicas
// of one GPU give the container that GPU, once). With
// failRequestsGreaterThanOne a request of more than one device that
// includes a replica is refused, as NVIDIA's plugin refuses it
// (internal/rm/rm.go ValidateRequest).
func (r *resource) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	devs := make([]*device, 0, len(ids))
	var uuids []string
	replica := false
	for _, id := range ids {
		d, ok := r.byID[id]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device %q", r.name, id)
		}
		replica = replica || d.replicas > 0
		if slices.Contains(uuids, d.uuid) {
			continue
		}
		uuids = append(uuids, d.uuid)
		devs = append(devs, d)
	}
	if ts := r.cfg.TimeSlicing; replica && len(ids) > 1 && ts != nil && ts.FailRequestsGreaterThanOne {
		return nil, status.Errorf(codes.InvalidArgument, "%s: maximum request size for shared resources is 1; found %d (sharing.timeSlicing.failRequestsGreaterThanOne)", r.name, len(ids))
	}

	resp := &pluginapi.ContainerAllocateResponse{}
	switch r.cfg.DeviceListStrategy {
	case DeviceListEnvvar:
		resp.Envs = map[string]string{visibleDevicesEnv: strings.Join(uuids, ",")}
	case DeviceListVolumeMounts:
		// The runtime reads the device list from the mount points, not the
		// env var, so a pod can't widen its own access by setting it.
		resp.Envs = map[string]string{visibleDevicesEnv: volumeMountsRoot}
		for _, id := range uuids {
			resp.Mounts = append(resp.Mounts, &pluginapi.Mount{
				HostPath:      "/dev/null",
				ContainerPath: filepath.Join(volumeMountsRoot, id),
				ReadOnly:      true,
			})
		}
	case DeviceListCDICRI:
		for _, id := range uuids {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: parser.QualifiedName(cdiVendor, cdiClass, id)})
		}
	default:
		return nil, status.Errorf(codes.Internal, "%s: device-list strategy %q not supported", r.name, r.cfg.DeviceListStrategy)
	}

	if r.cfg.PassDeviceSpecs {
		specs, err := r.deviceSpecs(devs)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "%s: %v", r.name, err)
		}
		resp.Devices = specs
	}
	if r.cfg.Recorder != nil {
		var gpus []string
		for _, d := range devs {
			if !slices.Contains(gpus, d.gpu) {
				gpus = append(gpus, d.gpu)
			}
		}
		r.cfg.Recorder.Record(gpus)
	}
	return resp, nil
}

// deviceSpecs lists the device nodes for devs plus the control nodes, each
// once. A device's own nodes must exist under the host root: without them
// the container would start with no GPU, so that is an error. The control
// nodes are passed only when present (nvidia-uvm-tools, for one, is often
// absent). Paths are the host's own (without the host root): the runtime
// resolves them on the host.
func (r *resource) deviceSpecs(devs []*device) ([]*pluginapi.DeviceSpec, error) {
	var specs []*pluginapi.DeviceSpec
	seen := map[string]bool{}
	add := func(p string) error {
		if seen[p] {
			return nil
		}
		seen[p] = true
		if _, err := os.Stat(filepath.Join(r.cfg.HostRoot, p)); err != nil {
			return err
		}
		specs = append(specs, &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"})
		return nil
	}
	for _, d := range devs {
		if d.capsErr != nil {
			return nil, fmt.Errorf("mig device %s: capability device nodes unknown: %w", d.id, d.capsErr)
		}
		for _, p := range d.nodes {
			if err := add(p); err != nil {
				return nil, fmt.Errorf("device %s: device node %s under host root %q: %w", d.id, p, r.cfg.HostRoot, err)
			}
		}
	}
	for _, p := range controlNodes {
		_ = add(p) // optional: absent ones are left out
	}
	return specs, nil
}

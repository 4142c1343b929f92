package plugin

import (
	"context"
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// GetDevicePluginOptions tells the kubelet which optional calls the current
// Resource value supports.
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	res, _ := s.resource()
	return options(res), nil
}

// ListAndWatch sends the current list, then every changed list, until the
// kubelet goes away, the resource is removed or the manager stops.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	w, devs, err := s.addWatcher()
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer s.removeWatcher(w)
	s.log.Debug("ListAndWatch stream opened")
	for {
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs.devs}); err != nil {
			return err
		}
		select {
		case devs = <-w.ch:
		case <-s.done:
			return nil
		case <-stream.Context().Done():
			return status.FromContextError(stream.Context().Err()).Err()
		}
	}
}

// Allocate checks every container request against the advertised device
// list before the Resource sees it: unknown IDs and IDs repeated anywhere
// in the request are InvalidArgument, unhealthy ones FailedPrecondition.
func (s *server) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	res, devs := s.resource()
	seen := map[string]bool{}
	for i, cr := range req.GetContainerRequests() {
		if len(cr.GetDevicesIds()) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "container request %d of %s asks for no devices", i, s.name)
		}
		for _, id := range cr.GetDevicesIds() {
			d, ok := devs.byID[id]
			switch {
			case !ok:
				return nil, status.Errorf(codes.InvalidArgument, "unknown %s device %q", s.name, id)
			case seen[id]:
				return nil, status.Errorf(codes.InvalidArgument, "%s device %q requested more than once", s.name, id)
			case d.Health != pluginapi.Healthy:
				return nil, status.Errorf(codes.FailedPrecondition, "%s device %q is unhealthy", s.name, id)
			}
			seen[id] = true
		}
	}
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, 0, len(req.GetContainerRequests()))}
	for _, cr := range req.GetContainerRequests() {
		cresp, err := res.Allocate(ctx, cr.GetDevicesIds())
		if err != nil {
			s.log.Warn("allocate failed", "devices", cr.GetDevicesIds(), "err", err)
			return nil, asStatus(err, "allocate %s devices", s.name)
		}
		if cresp == nil {
			return nil, status.Errorf(codes.Internal, "allocate %s devices: resource returned no response", s.name)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, cresp)
	}
	s.log.Info("allocated", "containers", len(resp.ContainerResponses), "devices", len(seen))
	return resp, nil
}

// GetPreferredAllocation validates the kubelet's request, asks the
// PreferredAllocator and checks its answer: the kubelet must never get a
// short, padded or foreign set.
func (s *server) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	res, devs := s.resource()
	pa, ok := res.(PreferredAllocator)
	if !ok {
		return nil, status.Errorf(codes.Unimplemented, "%s has no preferred allocation", s.name)
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for i, cr := range req.GetContainerRequests() {
		avail, must, size := cr.GetAvailableDeviceIDs(), cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize())
		if err := checkPreferredRequest(devs, avail, must, size); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "preferred allocation of %s, container request %d: %v", s.name, i, err)
		}
		ids, err := pa.PreferredAllocation(ctx, avail, must, size)
		if err != nil {
			s.log.Warn("preferred allocation failed", "available", len(avail), "size", size, "err", err)
			return nil, asStatus(err, "preferred allocation of %s", s.name)
		}
		if err := checkPreferredAnswer(ids, avail, must, size); err != nil {
			s.log.Error("preferred allocator broke its contract", "available", avail, "mustInclude", must, "size", size, "answer", ids, "err", err)
			return nil, status.Errorf(codes.Internal, "preferred allocation of %s: %v", s.name, err)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// PreStartContainer runs the Resource's PreStart hook, if it has one.
func (s *server) PreStartContainer(ctx context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	res, devs := s.resource()
	ps, ok := res.(PreStarter)
	if !ok {
		return &pluginapi.PreStartContainerResponse{}, nil
	}
	for _, id := range req.GetDevicesIds() {
		if _, ok := devs.byID[id]; !ok {
			return nil, status.Errorf(codes.InvalidArgument, "unknown %s device %q", s.name, id)
		}
	}
	if err := ps.PreStart(ctx, req.GetDevicesIds()); err != nil {
		s.log.Warn("pre-start failed", "devices", req.GetDevicesIds(), "err", err)
		return nil, asStatus(err, "pre-start %s devices", s.name)
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// asStatus keeps a gRPC status a Resource chose (e.g. InvalidArgument) and
// turns any other error into Internal.
func asStatus(err error, format string, args ...any) error {
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	return status.Errorf(codes.Internal, format+": %v", append(args, err)...)
}

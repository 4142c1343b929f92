package plugin

import (
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// fourGPUs is GPU-0..GPU-3 with GPU-3 unhealthy.
func fourGPUs() []Device {
	devs := gpus(4)
	devs[3].Healthy = false
	return devs
}

func TestAllocate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		allocErr error
		req      [][]string
		wantCode codes.Code
		wantEnvs []string // FAKE_DEVICES per container
	}{
		{name: "one container", req: [][]string{{"GPU-1", "GPU-0"}}, wantEnvs: []string{"GPU-1,GPU-0"}},
		{name: "two containers", req: [][]string{{"GPU-0"}, {"GPU-2", "GPU-1"}}, wantEnvs: []string{"GPU-0", "GPU-2,GPU-1"}},
		{name: "no containers", req: nil, wantEnvs: nil},
		{name: "unknown ID", req: [][]string{{"GPU-0", "GPU-9"}}, wantCode: codes.InvalidArgument},
		{name: "duplicate in one container", req: [][]string{{"GPU-0", "GPU-0"}}, wantCode: codes.InvalidArgument},
		{name: "duplicate across containers", req: [][]string{{"GPU-0"}, {"GPU-1", "GPU-0"}}, wantCode: codes.InvalidArgument},
		{name: "unhealthy", req: [][]string{{"GPU-3"}}, wantCode: codes.FailedPrecondition},
		{name: "unknown beats later unhealthy", req: [][]string{{"nope", "GPU-3"}}, wantCode: codes.InvalidArgument},
		{name: "empty container request", req: [][]string{{}}, wantCode: codes.InvalidArgument},
		{name: "resource error", allocErr: errors.New("boom"), req: [][]string{{"GPU-0"}}, wantCode: codes.Internal},
		{name: "resource status kept", allocErr: status.Error(codes.ResourceExhausted, "full"), req: [][]string{{"GPU-0"}}, wantCode: codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, Options{})
			e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: fourGPUs(), allocErr: tc.allocErr}})
			req := &pluginapi.AllocateRequest{}
			for _, ids := range tc.req {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
			}
			resp, err := e.client(t, "nvidia.com/gpu").Allocate(context.Background(), req)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("Allocate code = %v (%v), want %v", got, err, tc.wantCode)
			}
			if err != nil {
				return
			}
			var envs []string
			for _, cr := range resp.ContainerResponses {
				envs = append(envs, cr.Envs["FAKE_DEVICES"])
			}
			if !slices.Equal(envs, tc.wantEnvs) {
				t.Errorf("container responses = %v, want %v", envs, tc.wantEnvs)
			}
		})
	}
}

// TestAllocateSeesSync checks Allocate judges health by the list last
// synced, i.e. the one the kubelet was sent.
func TestAllocateSeesSync(t *testing.T) {
	e := newTestEnv(t, Options{})
	e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: fourGPUs()}})
	c := e.client(t, "nvidia.com/gpu")
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-3"}}}}
	if _, err := c.Allocate(context.Background(), req); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("unhealthy GPU-3: %v, want FailedPrecondition", err)
	}
	e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: gpus(4)}}) // GPU-3 recovered
	if _, err := c.Allocate(context.Background(), req); err != nil {
		t.Fatalf("recovered GPU-3: %v", err)
	}
}

func TestGetPreferredAllocation(t *testing.T) {
	type creq struct {
		avail, must []string
		size        int32
	}
	all := []string{"GPU-0", "GPU-1", "GPU-2", "GPU-3"}
	for _, tc := range []struct {
		name     string
		prefer   func(available, mustInclude []string, size int) ([]string, error)
		reqs     []creq
		wantCode codes.Code
		want     [][]string
	}{
		{name: "well behaved", prefer: firstN, reqs: []creq{{all, []string{"GPU-2"}, 2}}, want: [][]string{{"GPU-2", "GPU-0"}}},
		{name: "two containers", prefer: firstN, reqs: []creq{{all, nil, 1}, {all, nil, 4}}, want: [][]string{{"GPU-0"}, all}},
		{name: "size zero", prefer: firstN, reqs: []creq{{all, nil, 0}}, wantCode: codes.InvalidArgument},
		{name: "size negative", prefer: firstN, reqs: []creq{{all, nil, -1}}, wantCode: codes.InvalidArgument},
		{name: "size above available", prefer: firstN, reqs: []creq{{all[:2], nil, 3}}, wantCode: codes.InvalidArgument},
		{name: "must-include not available", prefer: firstN, reqs: []creq{{all[:2], []string{"GPU-3"}, 2}}, wantCode: codes.InvalidArgument},
		{name: "must-include above size", prefer: firstN, reqs: []creq{{all, all[:3], 2}}, wantCode: codes.InvalidArgument},
		{name: "unknown available", prefer: firstN, reqs: []creq{{[]string{"GPU-0", "GPU-9"}, nil, 1}}, wantCode: codes.InvalidArgument},
		{name: "unknown must-include", prefer: firstN, reqs: []creq{{all, []string{"GPU-9"}, 1}}, wantCode: codes.InvalidArgument},
		{name: "available repeated", prefer: firstN, reqs: []creq{{[]string{"GPU-0", "GPU-0"}, nil, 1}}, wantCode: codes.InvalidArgument},
		{name: "allocator short", reqs: []creq{{all, nil, 3}}, wantCode: codes.Internal,
			prefer: func(a, _ []string, _ int) ([]string, error) { return a[:2], nil }},
		{name: "allocator padded", reqs: []creq{{all, nil, 2}}, wantCode: codes.Internal,
			prefer: func(a, _ []string, _ int) ([]string, error) { return a[:3], nil }},
		{name: "allocator padded with empty IDs", reqs: []creq{{all, nil, 3}}, wantCode: codes.Internal,
			prefer: func(a, _ []string, _ int) ([]string, error) { return []string{a[0], "", ""}, nil }},
		{name: "allocator duplicate", reqs: []creq{{all, nil, 2}}, wantCode: codes.Internal,
			prefer: func(a, _ []string, _ int) ([]string, error) { return []string{a[1], a[1]}, nil }},
		{name: "allocator foreign ID", reqs: []creq{{all[:2], nil, 2}}, wantCode: codes.Internal,
			prefer: func(_, _ []string, _ int) ([]string, error) { return []string{"GPU-0", "GPU-3"}, nil }},
		{name: "allocator drops must-include", reqs: []creq{{all, []string{"GPU-3"}, 1}}, wantCode: codes.Internal,
			prefer: func(a, _ []string, _ int) ([]string, error) { return a[:1], nil }},
		{name: "allocator error", reqs: []creq{{all, nil, 1}}, wantCode: codes.Internal,
			prefer: func(_, _ []string, _ int) ([]string, error) { return nil, errors.New("no solution") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, Options{})
			e.m.Sync([]Resource{&preferredResource{fakeResource: &fakeResource{name: "nvidia.com/gpu", devs: fourGPUs()}, prefer: tc.prefer}})
			req := &pluginapi.PreferredAllocationRequest{}
			for _, r := range tc.reqs {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerPreferredAllocationRequest{
					AvailableDeviceIDs: r.avail, MustIncludeDeviceIDs: r.must, AllocationSize: r.size,
				})
			}
			resp, err := e.client(t, "nvidia.com/gpu").GetPreferredAllocation(context.Background(), req)
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("GetPreferredAllocation code = %v (%v), want %v", got, err, tc.wantCode)
			}
			if err != nil {
				if resp != nil {
					t.Errorf("response %v alongside error", resp)
				}
				return
			}
			var got [][]string
			for _, cr := range resp.ContainerResponses {
				got = append(got, cr.DeviceIDs)
			}
			if !slices.EqualFunc(got, tc.want, slices.Equal) {
				t.Errorf("preferred = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestGetPreferredAllocationWithoutAllocator(t *testing.T) {
	e := newTestEnv(t, Options{})
	e.m.Sync([]Resource{&fakeResource{name: "nvidia.com/gpu", devs: gpus(2)}})
	_, err := e.client(t, "nvidia.com/gpu").GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"GPU-0"}, AllocationSize: 1}},
	})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
}

func TestPreStartContainer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		hookErr   error
		ids       []string
		wantCode  codes.Code
		wantCalls int
	}{
		{name: "hook runs", ids: []string{"GPU-0", "GPU-1"}, wantCalls: 1},
		{name: "hook fails", hookErr: errors.New("reset failed"), ids: []string{"GPU-0"}, wantCode: codes.Internal, wantCalls: 1},
		{name: "unknown ID", ids: []string{"GPU-7"}, wantCode: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, Options{})
			r := &preStartResource{fakeResource: &fakeResource{name: "rdma/hca", devs: gpus(2)}, err: tc.hookErr}
			e.m.Sync([]Resource{r})
			_, err := e.client(t, "rdma/hca").PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{DevicesIds: tc.ids})
			if got := status.Code(err); got != tc.wantCode {
				t.Fatalf("PreStartContainer code = %v (%v), want %v", got, err, tc.wantCode)
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.calls) != tc.wantCalls {
				t.Fatalf("hook called %d times, want %d", len(r.calls), tc.wantCalls)
			}
			if tc.wantCalls > 0 && !slices.Equal(r.calls[0], tc.ids) {
				t.Errorf("hook got %v, want %v", r.calls[0], tc.ids)
			}
		})
	}
}

package conformance

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func ids(devs []*pluginapi.Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.ID)
	}
	sort.Strings(out)
	return out
}

// visible returns the sorted UUIDs of NVIDIA_VISIBLE_DEVICES.
func visible(r *pluginapi.ContainerAllocateResponse) []string {
	v, ok := r.Envs["NVIDIA_VISIBLE_DEVICES"]
	if !ok {
		return nil
	}
	out := strings.Split(v, ",")
	sort.Strings(out)
	return out
}

// TestAllocate calls Allocate through the kubelet's plugin client, as the
// device manager does when it admits a container.
func TestAllocate(t *testing.T) {
	n := startNode(t, demoNode, "mixed")
	got := n.waitCounts(t, map[string]int{
		"nvidia.com/gpu": 6, "nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-1g.10gb": 9,
	})
	gpus, migs := ids(got["nvidia.com/gpu"]), ids(got["nvidia.com/mig-1g.10gb"])

	cases := []struct {
		name     string
		resource string
		// containers lists each container's requested device IDs.
		containers [][]string
		wantCode   codes.Code
	}{
		{"two whole GPUs", "nvidia.com/gpu", [][]string{{gpus[0], gpus[3]}}, codes.OK},
		{"one GPU", "nvidia.com/gpu", [][]string{{gpus[5]}}, codes.OK},
		{"every GPU", "nvidia.com/gpu", [][]string{gpus}, codes.OK},
		{"two containers", "nvidia.com/gpu", [][]string{{gpus[1]}, {gpus[2], gpus[4]}}, codes.OK},
		{"MIG devices", "nvidia.com/mig-1g.10gb", [][]string{{migs[0], migs[8]}}, codes.OK},
		{"unknown ID", "nvidia.com/gpu", [][]string{{"GPU-00000000-0000-0000-0000-000000000000"}}, codes.InvalidArgument},
		{"unknown among known", "nvidia.com/gpu", [][]string{{gpus[0], "no-such-device"}}, codes.InvalidArgument},
		{"MIG device asked of the GPU resource", "nvidia.com/gpu", [][]string{{migs[0]}}, codes.InvalidArgument},
		{"GPU asked of a MIG resource", "nvidia.com/mig-1g.10gb", [][]string{{gpus[0]}}, codes.InvalidArgument},
		{"same device twice in a container", "nvidia.com/gpu", [][]string{{gpus[0], gpus[0]}}, codes.InvalidArgument},
		{"same device in two containers", "nvidia.com/gpu", [][]string{{gpus[0]}, {gpus[0]}}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			client, err := n.kubelet.Client(tc.resource)
			if err != nil {
				t.Fatal(err)
			}
			req := &pluginapi.AllocateRequest{}
			for _, c := range tc.containers {
				req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: c})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := client.Allocate(ctx, req)
			if code := status.Code(err); code != tc.wantCode {
				t.Fatalf("Allocate(%v) code = %s (%v), want %s", tc.containers, code, err, tc.wantCode)
			}
			if tc.wantCode != codes.OK {
				return
			}
			if len(resp.ContainerResponses) != len(tc.containers) {
				t.Fatalf("got %d container responses, want %d", len(resp.ContainerResponses), len(tc.containers))
			}
			for i, c := range tc.containers {
				want := append([]string(nil), c...)
				sort.Strings(want)
				if got := visible(resp.ContainerResponses[i]); strings.Join(got, ",") != strings.Join(want, ",") {
					t.Errorf("container %d: NVIDIA_VISIBLE_DEVICES = %v, want %v", i, got, want)
				}
			}
		})
	}
}

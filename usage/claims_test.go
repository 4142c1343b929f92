package usage

import (
	"testing"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
)

// TestAssignmentsClaim: a device one DRA claim holds answers that claim
// with the driver, pool and device name the kubelet listed, also when
// two pods share the claim; a device-plugin device, a free device and a
// device two claims name answer none.
func TestAssignmentsClaim(t *testing.T) {
	shared := claim("ml", "shared-gpu", ours(claimInfer, draPool, devGPU1, "gpus"))
	pods := []*podresourcesv1.PodResources{
		trainDRA(draPool),
		pod("ml", "a", draContainer("main", shared)),
		pod("ml", "b", draContainer("main", shared)),
		pod("ml", "dp", container("main", "nvidia.com/gpu", gpu2)),
		pod("serving", "x", draContainer("main", claim("serving", "one", ours(claimInfer, draPool, devMIG1, "mig")))),
		pod("serving", "y", draContainer("main", claim("serving", "two", ours(claimExt, draPool, devMIG1, "mig")))),
	}
	a := newAssignments(&podresourcesv1.ListPodResourcesResponse{PodResources: pods}, nil, newDRADevices(draPool, draNode()), nil)
	for _, tt := range []struct {
		name string
		id   string
		want DRAClaim
		ok   bool
	}{
		{"one claim", gpu0, DRAClaim{"ml", "train-0-gpus-x7k2p", dra.DriverName, draPool, devGPU0}, true},
		{"a claim two pods share", gpu1, DRAClaim{"ml", "shared-gpu", dra.DriverName, draPool, devGPU1}, true},
		{"a device-plugin device", gpu2, DRAClaim{}, false},
		{"a free device", mig0, DRAClaim{}, false},
		{"two claims name it", mig1, DRAClaim{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := a.Claim(tt.id)
			if got != tt.want || ok != tt.ok {
				t.Errorf("Claim(%s) = %+v, %v; want %+v, %v", tt.id, got, ok, tt.want, tt.ok)
			}
		})
	}
	var none *Assignments
	if _, ok := none.Claim(gpu0); ok {
		t.Error("nil Assignments answer a claim")
	}
}

package topology_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// BenchmarkAdviseMoves measures AdviseMoves on fragmenting layouts of the
// largest real node (DGX-2, 16 GPUs on one NVSwitch fabric, where every
// set of GPUs is a block) and on a made-up 64-GPU node where the search
// meets its step bound.
func BenchmarkAdviseMoves(b *testing.B) {
	dgx2, err := topology.LoadSnapshot(filepath.Join("testdata", "profiles", "dgx-2.json"))
	if err != nil {
		b.Fatal(err)
	}
	// every second GPU held by a 1-GPU pod: BlockNow 8, target 16.
	alternate := func(n *topology.Node) []topology.PodHold {
		return onePerGPU(n, "b/p", 0, 2, 4, 6, 8, 10, 12, 14)
	}
	for _, bc := range []struct {
		name  string
		node  *topology.Node
		holds []topology.PodHold
	}{
		// 12 GPUs held one per pod, 4 free: target 8 needs any 4 of
		// the 12 pods; C(12,4) = 495 blocks tie.
		{"dgx-2/free=4/pods=12x1", dgx2, onePerGPU(dgx2, "b/p", seq(0, 11)...)},
		// 16 GPUs held in pairs by 8 pods: BlockNow 0, target 1.
		{"dgx-2/free=0/pods=8x2", dgx2, func() []topology.PodHold {
			var hs []topology.PodHold
			for i := 0; i < 16; i += 2 {
				hs = append(hs, pod(fmt.Sprintf("b/pair-%d", i), uuids(dgx2, i, i+1)...))
			}
			return hs
		}()},
		// 5 free, the rest held by pods of 1, 2 and 4 GPUs: target 8.
		{"dgx-2/free=5/pods=1+2+4+1+2+1", dgx2, []topology.PodHold{
			pod("b/a", uuids(dgx2, 0)...), pod("b/b", uuids(dgx2, 2, 9)...),
			pod("b/c", uuids(dgx2, 4, 5, 12, 13)...), pod("b/d", uuids(dgx2, 7)...),
			pod("b/e", uuids(dgx2, 10, 15)...), pod("b/f", uuids(dgx2, 11)...),
		}},
		{"dgx-2/free=8/pods=8x1", dgx2, alternate(dgx2)},
		// 64 GPUs all linked, 44 held one per pod: target 32, C(44,12)
		// blocks tie; the search stops at its bound.
		{"made-up-64/free=20/pods=44x1", linkedNode(64, func(int, int) bool { return true }), nil},
	} {
		holds := bc.holds
		if holds == nil {
			holds = onePerGPU(bc.node, "b/p", seq(0, 43)...)
		}
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var adv topology.MoveAdvice
			for b.Loop() {
				adv = topology.AdviseMoves(bc.node, nil, holds)
			}
			b.ReportMetric(float64(len(adv.Block)), "target")
			b.ReportMetric(float64(len(adv.Pods)), "pods")
		})
	}
}

package sim

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

//go:generate go run ./internal/directgen

// directLib and directDevice are what NVML() hands out: they call the
// mocks' XxxFunc fields directly instead of through the mock methods, which
// append every call's arguments to a slice that is never trimmed (4 KiB per
// metrics scrape of an 8-GPU node, measured) and would grow an agent that
// runs for days on a simulated node without bound. Handles are values, so
// two handles of one device compare equal: a MIG device's handle carries its
// parent GPU's gate, a GPU's its own (calls.go), and both come only from
// n.handle and n.migHandle.
type (
	directLib struct {
		m *mock.Interface
		c *callCounts
	}
	directDevice struct {
		m *mock.Device
		g *gpuGate
	}
)

var (
	_ nvml.Interface = directLib{}
	_ nvml.Device    = directDevice{}
)

// handle is the NVML handle of GPU i.
func (n *Node) handle(i int) nvml.Device {
	return directDevice{m: &n.devices[i].Device, g: n.gates[i]}
}

// migHandle is the NVML handle of MIG device m of GPU gpu.
func (n *Node) migHandle(gpu int, m *mock.Device) nvml.Device {
	return directDevice{m: m, g: n.gates[gpu]}
}

// indexOf finds the GPU behind a handle (a direct handle or the mock device
// itself); -1 if it is not one of this node's GPUs.
func (n *Node) indexOf(d nvml.Device) int {
	var m *mock.Device
	switch v := d.(type) {
	case directDevice:
		m = v.m
	case *mock.Device:
		m = v
	default:
		for i, dev := range n.devices {
			if any(dev) == d {
				return i
			}
		}
		return -1
	}
	for i, dev := range n.devices {
		if &dev.Device == m {
			return i
		}
	}
	return -1
}

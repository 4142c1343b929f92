package sim

import (
	"reflect"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

var returnType = reflect.TypeOf(nvml.SUCCESS)

// FillUnsupported gives every unset XxxFunc field of a go-nvml mock (a
// pointer to mock.Device, mock.GpuInstance, ...) an implementation that
// returns ERROR_NOT_SUPPORTED, as the simulator's own devices have: tests
// that build bare mocks use it so a call they did not set answers as a
// real GPU lacking the feature does, instead of panicking.
func FillUnsupported(mockPtr any) { fillUnsupported(mockPtr) }

// fillUnsupported gives every unset XxxFunc field of a go-nvml mock (a
// pointer to mock.Device, mock.GpuInstance, ...) an implementation that
// returns zero values and ERROR_NOT_SUPPORTED. An unset field makes the mock
// panic; a real driver answers "not supported" for what a GPU lacks, and the
// agent must survive whatever it asks the simulator.
func fillUnsupported(m any) { fillWith(m, nvml.ERROR_NOT_SUPPORTED) }

// fillWith gives every unset XxxFunc field of the mock m an implementation
// that returns zero values and ret.
func fillWith(m any, ret nvml.Return) {
	v := reflect.ValueOf(m).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := v.Field(i)
		name := t.Field(i).Name
		if !strings.HasSuffix(name, "Func") || f.Kind() != reflect.Func || !f.IsNil() || !f.CanSet() {
			continue
		}
		f.Set(reflect.MakeFunc(f.Type(), func([]reflect.Value) []reflect.Value {
			return zeroResults(f.Type(), ret)
		}))
	}
}

// zeroResults returns the zero values of ft's results with ret in the last
// nvml.Return slot.
func zeroResults(ft reflect.Type, ret nvml.Return) []reflect.Value {
	out := make([]reflect.Value, ft.NumOut())
	for i := range out {
		out[i] = reflect.Zero(ft.Out(i))
	}
	if k := ft.NumOut() - 1; k >= 0 && ft.Out(k) == returnType {
		out[k] = reflect.ValueOf(ret)
	}
	return out
}

// lostExempt are the calls a lost GPU still answers: its identity, which
// the driver keeps after the GPU falls off the bus, so that the agent can
// still say which device is gone.
var lostExempt = map[string]bool{
	"GetUUIDFunc":                            true,
	"GetIndexFunc":                           true,
	"GetMinorNumberFunc":                     true,
	"GetPciInfoFunc":                         true,
	"IsMigDeviceHandleFunc":                  true,
	"GetDeviceHandleFromMigDeviceHandleFunc": true,
	"GetGpuInstanceIdFunc":                   true,
	"GetComputeInstanceIdFunc":               true,
}

// wrapLost makes every call of d (except identity) fail with
// ERROR_GPU_IS_LOST while GPU gpu is marked lost.
func (n *Node) wrapLost(d *mock.Device, gpu int) {
	v := reflect.ValueOf(d).Elem()
	t := v.Type()
	g := n.gpus[gpu]
	for i := 0; i < t.NumField(); i++ {
		f := v.Field(i)
		name := t.Field(i).Name
		if !strings.HasSuffix(name, "Func") || f.Kind() != reflect.Func || f.IsNil() || lostExempt[name] {
			continue
		}
		ft := f.Type()
		if ft.NumOut() == 0 || ft.Out(ft.NumOut()-1) != returnType {
			continue
		}
		inner := reflect.ValueOf(f.Interface())
		f.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
			n.mu.RLock()
			lost := g.lost
			n.mu.RUnlock()
			if lost {
				return zeroResults(ft, nvml.ERROR_GPU_IS_LOST)
			}
			if ft.IsVariadic() {
				return inner.CallSlice(args)
			}
			return inner.Call(args)
		}))
	}
}

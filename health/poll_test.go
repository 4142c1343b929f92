package health

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// attachSampler gives m a sampler over its owner sampling node's GPUs every
// interval; tests run it or drive it with pollOnce.
func attachSampler(t testing.TB, m *Monitor, node *topology.Node, interval time.Duration) *nvmlowner.Sampler {
	t.Helper()
	s := nvmlowner.NewSampler(m.owner, nvmlowner.SamplerConfig{Interval: interval})
	s.SetTargets(nvmlowner.TargetsOf(node))
	m.SetSampler(s)
	return s
}

// pollOnce takes one sample of every GPU and runs the checks on it, as
// the poll loop does after each sampling cycle.
func (m *Monitor) pollOnce() {
	if m.sampler == nil {
		return
	}
	m.applySnapshot(m.sampler.SampleNow(context.Background()))
}

// notSupportedByDefault makes every unset XxxFunc field of a go-nvml mock
// answer ERROR_NOT_SUPPORTED (an unset one panics), as a real GPU answers
// for what it lacks.
func notSupportedByDefault(mockPtr any) {
	v := reflect.ValueOf(mockPtr).Elem()
	ret := reflect.TypeOf(nvml.SUCCESS)
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if !strings.HasSuffix(v.Type().Field(i).Name, "Func") || f.Kind() != reflect.Func || !f.IsNil() {
			continue
		}
		ft := f.Type()
		f.Set(reflect.MakeFunc(ft, func([]reflect.Value) []reflect.Value {
			out := make([]reflect.Value, ft.NumOut())
			for k := range out {
				out[k] = reflect.Zero(ft.Out(k))
				if ft.Out(k) == ret {
					out[k] = reflect.ValueOf(nvml.ERROR_NOT_SUPPORTED)
				}
			}
			return out
		}))
	}
}

// ownerOf is an NVML owner over lib with the default call timeout.
func ownerOf(lib nvml.Interface) *nvmlowner.Owner {
	return nvmlowner.New(lib, nvmlowner.Config{}, discard())
}

package compare

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// device is one census device (a GPU or a MIG device) and the census's
// answers on it.
type device struct {
	*nvmlowner.CensusDevice
}

// answer is the value of the device's first call to method with args (as
// the census records them: enum names, numbers), or why there is none.
func (d device) answer(method string, args ...string) (any, string) {
	name := method
	if len(args) > 0 {
		name += "(" + strings.Join(args, ", ") + ")"
	}
	for _, c := range d.Calls {
		if c.Method != method || !sameArgs(c.Args, args) {
			continue
		}
		if c.Ret != "SUCCESS" {
			why := "census: " + name + " answered " + c.Ret
			if c.Error != "" {
				why += " (" + c.Error + ")"
			}
			return nil, why
		}
		return c.Value, ""
	}
	return nil, "census: no " + name + " call"
}

func sameArgs(got []any, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if fmt.Sprint(got[i]) != want[i] {
			return false
		}
	}
	return true
}

// number is the device's numeric answer (field names a field of a
// struct answer), or why there is none.
func (d device) number(method string, field string, args ...string) (float64, string) {
	v, why := d.answer(method, args...)
	if why != "" {
		return 0, why
	}
	if field != "" {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, fmt.Sprintf("census: %s answered %v, not an object", method, v)
		}
		v = m[field]
	}
	f, ok := toFloat(v)
	if !ok {
		return 0, fmt.Sprintf("census: %s %s is %v, not a number", method, field, v)
	}
	return f, ""
}

// text is the device's string answer (or a field of it), or why there is
// none.
func (d device) text(method, field string, args ...string) (string, string) {
	v, why := d.answer(method, args...)
	if why != "" {
		return "", why
	}
	if field != "" {
		m, ok := v.(map[string]any)
		if !ok {
			return "", fmt.Sprintf("census: %s answered %v, not an object", method, v)
		}
		v = m[field]
	}
	if s, ok := v.(string); ok {
		return s, ""
	}
	if b, ok := v.(bool); ok {
		return fmt.Sprint(b), ""
	}
	return "", fmt.Sprintf("census: %s %s is %v, not a string", method, field, v)
}

// count is the length of a list answer (GetRetiredPages), or why there is
// none.
func (d device) count(method string, args ...string) (float64, string) {
	v, why := d.answer(method, args...)
	if why != "" {
		return 0, why
	}
	l, ok := v.([]any)
	if !ok {
		return 0, fmt.Sprintf("census: %s answered %v, not a list", method, v)
	}
	return float64(len(l)), ""
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case float64:
		return x, true
	case int:
		return float64(x), true
	}
	return 0, false
}

// gpus are the census's GPUs in NVML index order, each with its MIG
// devices.
type censusGPU struct {
	device
	migs []device
}

func censusGPUs(c *nvmlowner.Census) []*censusGPU {
	var out []*censusGPU
	byIndex := map[int]*censusGPU{}
	for i := range c.Devices {
		d := &c.Devices[i]
		if d.Parent == nil {
			g := &censusGPU{device: device{d}}
			out = append(out, g)
			byIndex[d.Index] = g
		}
	}
	for i := range c.Devices {
		d := &c.Devices[i]
		if d.Parent != nil {
			if g, ok := byIndex[*d.Parent]; ok {
				g.migs = append(g.migs, device{d})
			}
		}
	}
	return out
}

// migEnabled says whether the census found the GPU in MIG mode
// (GetMigMode's current mode, nvml.h NVML_DEVICE_MIG_ENABLE = 1).
func (g *censusGPU) migEnabled() bool {
	m, why := g.number("GetMigMode", "currentMode")
	return why == "" && m == 1
}

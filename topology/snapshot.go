package topology

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
)

// LoadSnapshot reads and validates a topology snapshot file. Errors name the
// file and the field, e.g. `snap.json: gpus[3].uuid: duplicate "GPU-…"`.
func LoadSnapshot(path string) (*Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("topology snapshot: %w", err)
	}
	n, err := ParseSnapshot(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return n, nil
}

// ParseSnapshot decodes and validates a topology snapshot. It is strict:
// unknown fields, values of the wrong type and trailing data are refused,
// with the JSON path of the offending field in the error. Links may list a
// pair in either order (they are stored with A < B); MIG devices that omit
// "index" are numbered by position, and a GPU listing MIG devices is taken to
// have MIG enabled.
func ParseSnapshot(data []byte) (*Node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("invalid JSON: trailing data after the snapshot object")
	}
	if err := checkShape(raw, reflect.TypeOf(Node{}), ""); err != nil {
		return nil, err
	}
	var n Node
	if err := json.Unmarshal(data, &n); err != nil {
		// checkShape has vetted every key and type, so this is unexpected.
		return nil, fmt.Errorf("decode snapshot: %w", err)
	}
	normalize(&n, raw)
	if err := n.Validate(); err != nil {
		return nil, err
	}
	return &n, nil
}

// checkShape walks decoded JSON against the Go type it will be decoded
// into, so that unknown fields and type mismatches are reported with their
// full path (encoding/json names neither the array index nor, for unknown
// fields, the enclosing object).
func checkShape(v any, t reflect.Type, path string) error {
	where := path
	if where == "" {
		where = "snapshot"
	}
	if v == nil {
		// null is the zero value, as encoding/json treats it.
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkShape(v, t.Elem(), path)
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %s", where, jsonKind(v))
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("%s: unknown field (known: %s)", join(path, k), strings.Join(sortedKeys(fields), ", "))
			}
			if err := checkShape(obj[k], ft, join(path, k)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		arr, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %s", where, jsonKind(v))
		}
		for i, e := range arr {
			if err := checkShape(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.String:
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%s: want a string, got %s", where, jsonKind(v))
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: want true or false, got %s", where, jsonKind(v))
		}
	case reflect.Int, reflect.Int64, reflect.Int32:
		num, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: want an integer, got %s", where, jsonKind(v))
		}
		if _, err := num.Int64(); err != nil {
			return fmt.Errorf("%s: want an integer, got %s", where, num)
		}
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		num, ok := v.(json.Number)
		if !ok {
			return fmt.Errorf("%s: want a non-negative integer, got %s", where, jsonKind(v))
		}
		if i, err := num.Int64(); err != nil || i < 0 {
			return fmt.Errorf("%s: want a non-negative integer, got %s", where, num)
		}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func jsonKind(v any) string {
	switch x := v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return fmt.Sprintf("string %q", x)
	case json.Number:
		return "number " + x.String()
	case bool:
		return fmt.Sprintf("%t", x)
	}
	return fmt.Sprintf("%T", v)
}

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func sortedKeys(m map[string]reflect.Type) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// normalize applies the snapshot's documented defaults; raw tells which
// optional keys were present.
func normalize(n *Node, raw any) {
	top, _ := raw.(map[string]any)
	gpus, _ := top["gpus"].([]any)
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if len(g.MIG) > 0 {
			g.MIGEnabled = true
			g.MIGCapable = true
		}
		var rawMIG []any
		if i < len(gpus) {
			if obj, ok := gpus[i].(map[string]any); ok {
				rawMIG, _ = obj["mig"].([]any)
			}
		}
		for k := range g.MIG {
			if k < len(rawMIG) {
				if obj, ok := rawMIG[k].(map[string]any); ok {
					if _, has := obj["index"]; !has {
						g.MIG[k].Index = k
					}
				}
			}
		}
	}
	for i := range n.Links {
		if l := &n.Links[i]; l.A > l.B {
			l.A, l.B = l.B, l.A
		}
	}
}

var migNamePattern = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^([0-9]+c\.)?[0-9]+g\.[0-9]+gb(\+[a-z0-9.,]+)?$`)
})

// ValidPCIeLevel reports whether l is one of the six PCIe levels.
func ValidPCIeLevel(l PCIeLevel) bool {
	switch l {
	case PCIeSameBoard, PCIeSingleSwitch, PCIeMultiSwitch, PCIeHostBridge, PCIeSameCPU, PCIeCrossCPU:
		return true
	}
	return false
}

// Validate checks that the model is self-consistent: GPUs listed in index
// order from 0 with unique "GPU-" UUIDs and bus IDs, fabric states nvml.h
// names and cluster UUIDs in canonical form, MIG devices with unique
// "MIG-" UUIDs, valid profile names and distinct GPU/compute instances,
// links between two different known GPUs with at most one entry per pair and
// a known PCIe level, and NICs with unique names referring to known GPUs.
// Errors carry the JSON path of the field at fault.
func (n *Node) Validate() error {
	uuids := map[string]string{}
	buses := map[string]string{}
	claim := func(seen map[string]string, key, path string) error {
		if prev, dup := seen[key]; dup {
			return fmt.Errorf("%s: duplicate %q (also %s)", path, key, prev)
		}
		seen[key] = path
		return nil
	}
	for i, g := range n.GPUs {
		p := fmt.Sprintf("gpus[%d]", i)
		if g.Index != i {
			return fmt.Errorf("%s.index: %d, want %d (gpus are listed in index order from 0)", p, g.Index, i)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) < 5 {
			return fmt.Errorf("%s.uuid: %q is not a GPU UUID (want \"GPU-…\")", p, g.UUID)
		}
		if err := claim(uuids, g.UUID, p+".uuid"); err != nil {
			return err
		}
		if g.PCIBusID != "" {
			if !IsBusID(g.PCIBusID) {
				return fmt.Errorf("%s.pciBusID: %q is not a bus ID (want lower-case \"0000:07:00.0\")", p, g.PCIBusID)
			}
			if err := claim(buses, g.PCIBusID, p+".pciBusID"); err != nil {
				return err
			}
		}
		if g.NUMANode < -1 {
			return fmt.Errorf("%s.numaNode: %d, want -1 (none) or a node number", p, g.NUMANode)
		}
		if g.Minor < 0 {
			return fmt.Errorf("%s.minor: %d is negative", p, g.Minor)
		}
		if err := validatePath(g.PCIPath, g.PCIBusID, p); err != nil {
			return err
		}
		if err := g.Fabric.validate(p); err != nil {
			return err
		}
		if len(g.MIG) > 0 && !g.MIGEnabled {
			return fmt.Errorf("%s.mig: MIG devices listed but migEnabled is false", p)
		}
		instances := map[[2]int]bool{}
		indices := map[int]bool{}
		for k, m := range g.MIG {
			mp := fmt.Sprintf("%s.mig[%d]", p, k)
			if !strings.HasPrefix(m.UUID, "MIG-") || len(m.UUID) < 5 {
				return fmt.Errorf("%s.uuid: %q is not a MIG UUID (want \"MIG-…\")", mp, m.UUID)
			}
			if err := claim(uuids, m.UUID, mp+".uuid"); err != nil {
				return err
			}
			if !migNamePattern().MatchString(m.Profile) {
				return fmt.Errorf("%s.profile: %q is not a MIG profile name (want e.g. \"1g.10gb\")", mp, m.Profile)
			}
			if m.GPUInstance < 0 || m.ComputeInstance < 0 {
				return fmt.Errorf("%s.gi: instance IDs must not be negative", mp)
			}
			if instances[[2]int{m.GPUInstance, m.ComputeInstance}] {
				return fmt.Errorf("%s.gi: gpu instance %d / compute instance %d used twice", mp, m.GPUInstance, m.ComputeInstance)
			}
			instances[[2]int{m.GPUInstance, m.ComputeInstance}] = true
			if indices[m.Index] {
				return fmt.Errorf("%s.index: duplicate MIG index %d", mp, m.Index)
			}
			indices[m.Index] = true
		}
	}
	pairs := map[[2]int]string{}
	for i, l := range n.Links {
		p := fmt.Sprintf("links[%d]", i)
		for _, end := range []struct {
			name string
			v    int
		}{{"a", l.A}, {"b", l.B}} {
			if end.v < 0 || end.v >= len(n.GPUs) {
				return fmt.Errorf("%s.%s: unknown gpu index %d (snapshot has %d gpus)", p, end.name, end.v, len(n.GPUs))
			}
		}
		if l.A == l.B {
			return fmt.Errorf("%s.b: a link joins two different gpus, both are %d", p, l.A)
		}
		if l.A > l.B {
			return fmt.Errorf("%s.a: %d must be less than b (%d)", p, l.A, l.B)
		}
		key := [2]int{l.A, l.B}
		if prev, dup := pairs[key]; dup {
			return fmt.Errorf("%s: duplicate pair %d-%d (also %s)", p, l.A, l.B, prev)
		}
		pairs[key] = p
		if l.NVLinks < 0 {
			return fmt.Errorf("%s.nvlinks: %d is negative", p, l.NVLinks)
		}
		if l.PCIe != "" && !ValidPCIeLevel(l.PCIe) {
			return fmt.Errorf("%s.pcie: %q is not one of same-board, single-switch, multi-switch, host-bridge, same-cpu, cross-cpu", p, l.PCIe)
		}
	}
	names := map[string]string{}
	for i, nic := range n.NICs {
		p := fmt.Sprintf("nics[%d]", i)
		if nic.Name == "" {
			return fmt.Errorf("%s.name: required", p)
		}
		if err := claim(names, nic.Name, p+".name"); err != nil {
			return err
		}
		if nic.PCIBusID != "" && !IsBusID(nic.PCIBusID) {
			return fmt.Errorf("%s.pciBusID: %q is not a bus ID (want lower-case \"0000:0c:00.0\")", p, nic.PCIBusID)
		}
		if nic.NUMANode < -1 {
			return fmt.Errorf("%s.numaNode: %d, want -1 (none) or a node number", p, nic.NUMANode)
		}
		if err := validatePath(nic.PCIPath, nic.PCIBusID, p); err != nil {
			return err
		}
		for k, gl := range nic.GPUs {
			gp := fmt.Sprintf("%s.gpus[%d]", p, k)
			if gl.GPU < 0 || gl.GPU >= len(n.GPUs) {
				return fmt.Errorf("%s.gpu: unknown gpu index %d (snapshot has %d gpus)", gp, gl.GPU, len(n.GPUs))
			}
			if !ValidPCIeLevel(gl.PCIe) {
				return fmt.Errorf("%s.pcie: %q is not one of same-board, single-switch, multi-switch, host-bridge, same-cpu, cross-cpu", gp, gl.PCIe)
			}
		}
	}
	return nil
}

func validatePath(path []string, busID, p string) error {
	for k, e := range path {
		if !IsBusID(e) {
			return fmt.Errorf("%s.pciPath[%d]: %q is not a bus ID", p, k, e)
		}
	}
	if len(path) > 0 && busID != "" && path[len(path)-1] != busID {
		return fmt.Errorf("%s.pciPath: ends at %s, not at the device's own bus ID %s", p, path[len(path)-1], busID)
	}
	return nil
}

// WriteSnapshot writes n as an indented JSON snapshot in a stable order
// (GPUs by index, links by pair, NICs by name) that ParseSnapshot reads back.
func WriteSnapshot(w io.Writer, n *Node) error {
	out := *n
	out.GPUs = slices.Clone(n.GPUs)
	out.Links = slices.Clone(n.Links)
	out.NICs = slices.Clone(n.NICs)
	sort.SliceStable(out.GPUs, func(i, j int) bool { return out.GPUs[i].Index < out.GPUs[j].Index })
	sort.SliceStable(out.Links, func(i, j int) bool {
		if out.Links[i].A != out.Links[j].A {
			return out.Links[i].A < out.Links[j].A
		}
		return out.Links[i].B < out.Links[j].B
	})
	sort.SliceStable(out.NICs, func(i, j int) bool { return out.NICs[i].Name < out.NICs[j].Name })
	data, err := json.MarshalIndent(&out, "", "  ")
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	data = append(data, '\n')
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("write snapshot: %w", err)
	}
	return nil
}

package hardware

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// Where a capture keeps what the replay reads.
const (
	captureCensus   = "agent/census.json"
	captureTopology = "agent/topology.json"
)

// staticValue projects, for each method whose answer does not move on one
// node (identity, model, links, limits, settings the kit never changes),
// the part of its value a replay compares; the other methods' values are
// readings (temperatures, counters, clocks, processes) and only their
// return codes are compared.
var staticValue = map[string]func(any) any{
	"SystemGetDriverVersion":     whole,
	"SystemGetCudaDriverVersion": whole,
	"DeviceGetCount":             whole,
	"DeviceGetHandleByIndex":     whole,
	"DeviceGetHandleByUUID":      whole,
	"Extensions":                 whole,
	"GetUUID":                    whole,
	"GetPciInfo":                 whole,
	"GetName":                    whole,
	"GetBrand":                   whole,
	"GetMinorNumber":             whole,
	"GetCudaComputeCapability":   whole,
	"GetTopologyCommonAncestor":  whole,
	"GetNvLinkState":             whole,
	"GetNvLinkRemoteDeviceType":  whole,
	"GetNvLinkRemotePciInfo":     whole,
	"GetMigMode":                 whole,
	"GetMaxMigDeviceCount":       whole,
	"GetGpuInstanceId":           whole,
	"GetComputeInstanceId":       whole,
	"GetAttributes":              whole,
	"GetGpuInstanceProfileInfo":  whole,
	"GpuInstance.GetInfo":        whole,
	"GetMaxPcieLinkGeneration":   whole,
	"GetMaxPcieLinkWidth":        whole,
	"GetEccMode":                 whole,
	"GetPersistenceMode":         whole,
	"GetMemoryInfo":              field("total"),
	"GetMemoryInfo_v2":           field("total"),
}

func whole(v any) any { return v }

// field is one field of an object value.
func field(name string) func(any) any {
	return func(v any) any {
		if m, ok := v.(map[string]any); ok {
			return m[name]
		}
		return v
	}
}

// Divergence is one call the simulator answers differently from the
// capture.
type Divergence struct {
	// Where is the device ("gpu 0", "gpu 0 mig 1"), "library" or
	// "events <types>".
	Where  string
	Method string
	Args   string
	// What is "ret", "value" or "call" (made on one side only).
	What           string
	Capture, Sim   string
	AllowedBecause string
}

func (d Divergence) String() string {
	s := fmt.Sprintf("%s %s(%s) %s: capture %s, simulator %s", d.Where, d.Method, d.Args, d.What, d.Capture, d.Sim)
	if d.AllowedBecause != "" {
		s += " (allowed: " + d.AllowedBecause + ")"
	}
	return s
}

// Allowed is the list of divergences that are known and explained: a
// method (or "*") and what differs, with the reason.
type Allowed []AllowedDivergence

// AllowedDivergence is one line of the allowed list.
type AllowedDivergence struct {
	Method, What, Reason string
}

// ReadAllowed reads the allowed list: one "METHOD WHAT: REASON" per line
// (WHAT is ret, value or call), '#' starting a comment.
func ReadAllowed(path string) (Allowed, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out Allowed
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		head, reason, ok := strings.Cut(line, ":")
		f := strings.Fields(head)
		if !ok || len(f) != 2 || strings.TrimSpace(reason) == "" || (f[1] != "ret" && f[1] != "value" && f[1] != "call") {
			return nil, fmt.Errorf("%s:%d: want \"METHOD ret|value|call: REASON\", got %q", path, n, line)
		}
		out = append(out, AllowedDivergence{Method: f[0], What: f[1], Reason: strings.TrimSpace(reason)})
	}
	return out, sc.Err()
}

// reason is why d is allowed, or "".
func (a Allowed) reason(d Divergence) string {
	for _, x := range a {
		if (x.Method == "*" || x.Method == d.Method) && x.What == d.What {
			return x.Reason
		}
	}
	return ""
}

// ReadCensus reads a capture's census.
func ReadCensus(dir string) (*nvmlowner.Census, error) {
	b, err := os.ReadFile(filepath.Join(dir, captureCensus))
	if err != nil {
		return nil, err
	}
	var c nvmlowner.Census
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, captureCensus), err)
	}
	return &c, nil
}

// SimCensus takes the census of the simulator running the capture's node
// (its topology snapshot, as --simulate capture:DIR runs it).
func SimCensus(ctx context.Context, dir, hostRoot string) (*nvmlowner.Census, error) {
	spec, err := topology.LoadSnapshot(filepath.Join(dir, captureTopology))
	if err != nil {
		return nil, err
	}
	node, err := sim.New(spec, hostRoot, nil)
	if err != nil {
		return nil, err
	}
	o := nvmlowner.New(node.NVML(), nvmlowner.Config{CallTimeout: 5 * time.Second}, nil)
	return o.Census(ctx, nvmlowner.CensusOptions{})
}

// callKey identifies a call within its list.
type callKey struct{ method, args string }

func keyed(calls []nvmlowner.CensusCall) (map[callKey]nvmlowner.CensusCall, []callKey) {
	m := map[callKey]nvmlowner.CensusCall{}
	var order []callKey
	for _, c := range calls {
		args, _ := json.Marshal(c.Args)
		k := callKey{c.Method, string(args)}
		if c.Device != nil {
			k.args = fmt.Sprintf("device %d: %s", *c.Device, args)
		}
		if _, dup := m[k]; !dup {
			order = append(order, k)
		}
		m[k] = c
	}
	return m, order
}

// Compare holds the simulator's census against the capture's, call by
// call: return codes always, values where staticValue says they do not
// move. Calls the census times stamps or leaves out (timeouts, calls not
// made) on the capture's side are not held against the simulator. Each
// divergence names its reason when allowed lists it.
func Compare(capture, simulated *nvmlowner.Census, allowed Allowed) []Divergence {
	var out []Divergence
	add := func(d Divergence) {
		d.AllowedBecause = allowed.reason(d)
		out = append(out, d)
	}
	compareCalls := func(where string, capCalls, simCalls []nvmlowner.CensusCall) {
		cm, order := keyed(capCalls)
		sm, _ := keyed(simCalls)
		for _, k := range order {
			c := cm[k]
			if c.Ret == nvmlowner.CensusCallTimeout || c.Ret == nvmlowner.CensusNotCalled || c.Ret == nvmlowner.CensusCancelled {
				continue
			}
			s, ok := sm[k]
			if !ok {
				add(Divergence{Where: where, Method: k.method, Args: k.args, What: "call", Capture: "made", Sim: "not made"})
				continue
			}
			if c.Ret != s.Ret {
				add(Divergence{Where: where, Method: k.method, Args: k.args, What: "ret", Capture: c.Ret, Sim: s.Ret})
				continue
			}
			proj, static := staticValue[k.method]
			if !static || c.Ret != "SUCCESS" && c.Ret != "" {
				continue
			}
			cv, sv := jsonOf(proj(c.Value)), jsonOf(proj(normal(s.Value)))
			if cv != sv {
				add(Divergence{Where: where, Method: k.method, Args: k.args, What: "value", Capture: cv, Sim: sv})
			}
		}
	}
	compareCalls("library", capture.Library, simulated.Library)
	simDevs := map[string]nvmlowner.CensusDevice{}
	for _, d := range simulated.Devices {
		simDevs[deviceName(d)] = d
	}
	for _, d := range capture.Devices {
		s, ok := simDevs[deviceName(d)]
		if !ok {
			add(Divergence{Where: deviceName(d), Method: "device", What: "call", Capture: "present", Sim: "absent"})
			continue
		}
		compareCalls(deviceName(d), d.Calls, s.Calls)
	}
	simEvents := map[string]nvmlowner.CensusEventSet{}
	for _, e := range simulated.Events {
		simEvents[e.EventTypes] = e
	}
	for _, e := range capture.Events {
		compareCalls("events "+e.EventTypes, e.Calls, simEvents[e.EventTypes].Calls)
	}
	return out
}

func deviceName(d nvmlowner.CensusDevice) string {
	if d.Parent != nil {
		return fmt.Sprintf("gpu %d mig %d", *d.Parent, d.Index)
	}
	return fmt.Sprintf("gpu %d", d.Index)
}

// normal is v as it reads back from JSON, so that a census taken in this
// process compares with one read from a file.
func normal(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

func jsonOf(v any) string {
	b, err := json.Marshal(normal(v))
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

//go:build simulator

package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/agent/simhw"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// simSpec is a parsed --simulate value.
type simSpec struct {
	// file is a topology snapshot to simulate; empty for a profile.
	file    string
	profile string
	// mig holds one MIG layout per GPU, in the order given.
	mig []simMIG
}

// CaptureTopology is where a hardware check capture keeps the node's
// topology snapshot (`topology dump`), relative to the capture.
const CaptureTopology = "agent/topology.json"

type simMIG struct {
	gpu      int
	profiles []string
}

// parseSimulate reads "PROFILE[,mig=GPU:PROF+PROF...]", "FILE.json" or
// "capture:DIR" (a hardware check kit's capture: the node its
// agent/topology.json describes, test/hardware). MIG profile names are
// joined with "+"; a media-extension suffix such as "1g.10gb+me" is
// recognised and kept whole.
func parseSimulate(s string) (simSpec, error) {
	if strings.HasSuffix(s, ".json") {
		return simSpec{file: s}, nil
	}
	if dir, ok := strings.CutPrefix(s, "capture:"); ok {
		if dir == "" {
			return simSpec{}, fmt.Errorf("%q: want capture:DIR, a hardware check capture", s)
		}
		return simSpec{file: filepath.Join(dir, CaptureTopology)}, nil
	}
	parts := strings.Split(s, ",")
	spec := simSpec{profile: parts[0]}
	if spec.profile == "" {
		return simSpec{}, fmt.Errorf("%q has no profile name", s)
	}
	seen := map[int]bool{}
	for _, p := range parts[1:] {
		v, ok := strings.CutPrefix(p, "mig=")
		if !ok {
			return simSpec{}, fmt.Errorf("%q: want mig=GPU:PROFILE+PROFILE..., got %q", s, p)
		}
		idx, layout, ok := strings.Cut(v, ":")
		gpu, err := strconv.Atoi(idx)
		if !ok || err != nil || gpu < 0 {
			return simSpec{}, fmt.Errorf("%q: want mig=GPU:PROFILE+PROFILE... with a GPU index, got %q", s, p)
		}
		if seen[gpu] {
			return simSpec{}, fmt.Errorf("%q: mig layout for gpu %d given twice", s, gpu)
		}
		seen[gpu] = true
		profiles := splitProfiles(layout)
		if len(profiles) == 0 {
			return simSpec{}, fmt.Errorf("%q: mig layout for gpu %d is empty", s, gpu)
		}
		spec.mig = append(spec.mig, simMIG{gpu: gpu, profiles: profiles})
	}
	return spec, nil
}

// splitProfiles splits "1g.10gb+1g.10gb+me+3g.40gb" into profile names,
// joining the "me" (media extensions) token back onto the one before it.
func splitProfiles(layout string) []string {
	var out []string
	for _, tok := range strings.Split(layout, "+") {
		switch {
		case tok == "":
			continue
		case tok == "me" && len(out) > 0:
			out[len(out)-1] += "+me"
		default:
			out = append(out, tok)
		}
	}
	return out
}

// node builds the simulated node model the spec describes.
func (s simSpec) node() (*topology.Node, error) {
	if s.file != "" {
		n, err := topology.LoadSnapshot(s.file)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		return n, nil
	}
	opts := make([]sim.ProfileOption, 0, len(s.mig))
	for _, m := range s.mig {
		opts = append(opts, sim.WithMIG(m.gpu, m.profiles...))
	}
	n, err := sim.Profile(s.profile, opts...)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	return n, nil
}

// String names the simulated node for logs and the inventory.
func (s simSpec) String() string {
	if s.file != "" {
		return "snapshot " + s.file
	}
	return s.profile
}

// defaultSimControlAddress is --sim-control-address's default.
const defaultSimControlAddress = "127.0.0.1:9402"

// validateSimulate checks --simulate and --sim-control-address.
func (c *Config) validateSimulate(add func(name, format string, a ...any)) {
	if c.Simulate == "" {
		return
	}
	if spec, err := parseSimulate(c.Simulate); err != nil {
		add("simulate", "%v", err)
	} else if spec.file != "" {
		if _, err := os.Stat(spec.file); err != nil {
			add("simulate", "snapshot %v", err)
		}
	} else if !slices.Contains(sim.Profiles(), spec.profile) {
		add("simulate", "unknown profile %q (known: %s)", spec.profile, strings.Join(sim.Profiles(), ", "))
	}
	if c.SimControlAddress != "" {
		if err := loopbackAddress(c.SimControlAddress); err != nil {
			add("sim-control-address", "%v", err)
		}
	}
	if _, err := parseSimFaults(c.SimFaults); err != nil {
		add("sim-faults", "%v", err)
	}
}

// parseSimFaults reads --sim-faults, "KIND[:GPU][=VALUE],...": the kinds
// are the control API's (sim.Fault), GPU defaults to 0, VALUE is what
// sim.Fault.SetValue reads for the kind (pcie-degraded=4x8,
// throttle=hw-slowdown, old-driver=535.54.03). Whether the simulator
// accepts a fault is checked when it is injected.
func parseSimFaults(s string) ([]sim.Fault, error) {
	if s == "" {
		return nil, nil
	}
	var faults []sim.Fault
	for _, p := range strings.Split(s, ",") {
		target, value, hasValue := strings.Cut(p, "=")
		kind, idx, hasGPU := strings.Cut(target, ":")
		f := sim.Fault{Kind: kind}
		if kind == "" {
			return nil, fmt.Errorf("%q: want KIND[:GPU][=VALUE],..., got %q", s, p)
		}
		if hasGPU {
			gpu, err := strconv.Atoi(idx)
			if err != nil || gpu < 0 {
				return nil, fmt.Errorf("%q: want KIND:GPU with a GPU index, got %q", s, p)
			}
			f.GPU = gpu
		}
		if hasValue {
			if err := f.SetValue(value); err != nil {
				return nil, fmt.Errorf("%q: %w", s, err)
			}
		}
		faults = append(faults, f)
	}
	return faults, nil
}

// openHardware opens what cfg says: a simulated node with --simulate, real
// NVML otherwise. With the default host root the simulated tree goes into
// a new temporary directory that Close removes. Errors are configuration
// errors (a bad profile or snapshot).
func openHardware(cfg *Config, log *slog.Logger) (agent.Hardware, error) {
	if cfg.Simulate == "" {
		return openNVML(cfg, log), nil
	}
	spec, err := parseSimulate(cfg.Simulate)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	// Build the model first: a bad profile or layout fails before any
	// directory is created.
	model, err := spec.node()
	if err != nil {
		return nil, err
	}
	faults, err := parseSimFaults(cfg.SimFaults)
	if err != nil {
		return nil, fmt.Errorf("sim-faults: %w", err)
	}
	return simhw.Open(simhw.Options{
		StartFaults:    faults,
		Model:          model,
		Name:           spec.String(),
		HostRoot:       cfg.HostRoot,
		NVML:           nvmlowner.Config{CallTimeout: cfg.NVMLCallTimeout.Duration},
		ControlAddress: cfg.SimControlAddress,
		Logger:         log,
	})
}

// loopbackAddress refuses anything but a loopback host: the simulator's
// control endpoint changes the node and has no authentication.
func loopbackAddress(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address", addr)
	}
	return nil
}

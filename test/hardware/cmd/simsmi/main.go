// Command simsmi stands in for nvidia-smi on a simulated node, for the
// hardware check kit's runs on the simulator (make hw-check-sim): hw-check.sh
// puts an nvidia-smi wrapper that runs it first on PATH, so the kit
// captures its references there too. It never travels to a GPU machine.
//
//	simsmi --simulate PROFILE[,mig=GPU:PROF+PROF...] [NVIDIA-SMI ARGS...]
//	simsmi --simulate FILE.json [NVIDIA-SMI ARGS...]
//
// It answers `-q -x` (package nvsmi's Query) and `-L` from the simulated
// node's NVML answers (package sim, the same node `gpu-node-agent-sim
// --simulate` builds, so UUIDs and bus IDs agree). `-q`, `topo -m` and
// `nvlink -s` are not simulated: they say so on stderr and exit 1. Any
// other argument exits 2.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/sim"
	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

const usage = `usage: simsmi --simulate PROFILE[,mig=GPU:PROF+PROF...]|FILE.json (-q -x | -L | -q | topo -m | nvlink -s)`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// command is what the nvidia-smi arguments ask.
type command int

const (
	queryXML command = iota
	list
	notSimulated
)

func run(args []string, stdout, stderr io.Writer) int {
	spec, rest, err := simulateArg(args)
	if err != nil {
		fmt.Fprintf(stderr, "simsmi: %v\n%s\n", err, usage)
		return 2
	}
	cmd, ok := parseCommand(rest)
	if !ok {
		fmt.Fprintf(stderr, "simsmi: unknown arguments %q\n%s\n", rest, usage)
		return 2
	}
	if cmd == notSimulated {
		fmt.Fprintf(stderr, "simsmi: nvidia-smi %s: not simulated\n", strings.Join(rest, " "))
		return 1
	}
	model, err := spec.node()
	if err != nil {
		fmt.Fprintf(stderr, "simsmi: %v\n", err)
		return 2
	}
	root, err := os.MkdirTemp("", "simsmi-")
	if err != nil {
		fmt.Fprintf(stderr, "simsmi: %v\n", err)
		return 1
	}
	defer os.RemoveAll(root)
	node, err := sim.New(model, root, nil)
	if err != nil {
		fmt.Fprintf(stderr, "simsmi: %v\n", err)
		return 2
	}
	var out []byte
	switch cmd {
	case queryXML:
		l, err := nvsmi.Query(node.NVML(), time.Now())
		if err == nil {
			out, err = nvsmi.Marshal(l)
		}
		if err != nil {
			fmt.Fprintf(stderr, "simsmi: %v\n", err)
			return 1
		}
	case list:
		s, err := nvsmi.List(node.NVML())
		if err != nil {
			fmt.Fprintf(stderr, "simsmi: %v\n", err)
			return 1
		}
		out = []byte(s)
	}
	if _, err := stdout.Write(out); err != nil {
		return 1
	}
	return 0
}

// parseCommand reads nvidia-smi's arguments: the options in any order.
func parseCommand(args []string) (command, bool) {
	set := slices.Clone(args)
	slices.Sort(set)
	norm := strings.Join(set, " ")
	switch norm {
	case "-q -x", "--query --xml-format", "--query -x", "--xml-format -q":
		return queryXML, true
	case "-L", "--list-gpus":
		return list, true
	case "-q", "--query":
		return notSimulated, true
	}
	if len(args) == 2 && (args[0] == "topo" && args[1] == "-m" || args[0] == "nvlink" && (args[1] == "-s" || args[1] == "--status")) {
		return notSimulated, true
	}
	return 0, false
}

// simSpec is a --simulate value, read as gpu-node-agent-sim reads it
// (cmd/gpu-node-agent/simulate.go, parseSimulate): that parser is in a
// main package and cannot be imported.
type simSpec struct {
	file    string
	profile string
	mig     []sim.ProfileOption
}

// simulateArg takes --simulate VALUE (or --simulate=VALUE) off the front
// of args.
func simulateArg(args []string) (simSpec, []string, error) {
	if len(args) == 0 {
		return simSpec{}, nil, fmt.Errorf("--simulate is required")
	}
	var v string
	switch {
	case args[0] == "--simulate" && len(args) > 1:
		v, args = args[1], args[2:]
	case strings.HasPrefix(args[0], "--simulate="):
		v, args = strings.TrimPrefix(args[0], "--simulate="), args[1:]
	default:
		return simSpec{}, nil, fmt.Errorf("--simulate PROFILE must come first")
	}
	spec, err := parseSimulate(v)
	return spec, args, err
}

func parseSimulate(s string) (simSpec, error) {
	if strings.HasSuffix(s, ".json") {
		return simSpec{file: s}, nil
	}
	parts := strings.Split(s, ",")
	spec := simSpec{profile: parts[0]}
	if spec.profile == "" {
		return simSpec{}, fmt.Errorf("--simulate %q has no profile name", s)
	}
	if !slices.Contains(sim.Profiles(), spec.profile) {
		return simSpec{}, fmt.Errorf("--simulate: unknown profile %q (known: %s)", spec.profile, strings.Join(sim.Profiles(), ", "))
	}
	for _, p := range parts[1:] {
		v, ok := strings.CutPrefix(p, "mig=")
		idx, layout, ok2 := strings.Cut(v, ":")
		gpu, err := strconv.Atoi(idx)
		if !ok || !ok2 || err != nil || gpu < 0 {
			return simSpec{}, fmt.Errorf("--simulate %q: want mig=GPU:PROFILE+PROFILE..., got %q", s, p)
		}
		var profiles []string
		for _, tok := range strings.Split(layout, "+") {
			switch {
			case tok == "":
			case tok == "me" && len(profiles) > 0:
				profiles[len(profiles)-1] += "+me"
			default:
				profiles = append(profiles, tok)
			}
		}
		spec.mig = append(spec.mig, sim.WithMIG(gpu, profiles...))
	}
	return spec, nil
}

func (s simSpec) node() (*topology.Node, error) {
	if s.file != "" {
		return topology.LoadSnapshot(s.file)
	}
	return sim.Profile(s.profile, s.mig...)
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// runTopology runs "topology dump", "topology labels" and "topology
// preferred".
func runTopology(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: gpu-node-agent topology dump|labels|preferred [flags]")
		return 2
	}
	switch args[0] {
	case "labels":
		return runTopologyLabels(args[1:], stdout, stderr, getenv)
	case "dump":
		if err := runTopologyDump(args[1:], stdout, stderr); err != nil {
			if err == flag.ErrHelp {
				return 0
			}
			fmt.Fprintf(stderr, "gpu-node-agent topology dump: %v\n", err)
			if errors.Is(err, errNoSimulator) {
				return 2
			}
			return 1
		}
		return 0
	case "preferred":
		if err := runTopologyPreferred(args[1:], stdout, stderr); err != nil {
			if err == flag.ErrHelp {
				return 0
			}
			fmt.Fprintf(stderr, "gpu-node-agent topology preferred: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "gpu-node-agent topology: unknown command %q (dump, labels, preferred)\n", args[0])
	return 2
}

// runTopologyDump discovers the node (real NVML, or --simulate) and prints
// its topology snapshot, the same JSON that --simulate FILE.json reads.
func runTopologyDump(args []string, stdout, stderr io.Writer) error {
	cfg := defaults()
	fs := flag.NewFlagSet("topology dump", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Simulate, "simulate", "", "dump a simulated node: PROFILE[,mig=GPU:PROF+PROF...] or FILE.json")
	fs.StringVar(&cfg.HostRoot, "host-root", cfg.HostRoot, "where the host's / is mounted")
	fs.StringVar(&cfg.LogLevel, "log-level", "warn", "log level (logs go to stderr)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(stderr, "text", cfg.LogLevel)
	hw, err := openHardware(&cfg, log)
	if err != nil {
		return err
	}
	defer hw.Close()
	node, err := hw.Discover()
	if err != nil {
		return err
	}
	// The NICs and their distance to each GPU, as the agent models them.
	s, ok := hw.(agent.Simulator)
	nics := rdma.OpenNICs(cfg.RDMA, rdma.NICsOptions{Root: hw.HostRoot(), Simulated: ok && s.Simulated(), Logger: log})
	defer nics.Close()
	nics.AddToNode(node)
	return topology.WriteSnapshot(stdout, node)
}

// runTopologyLabels discovers the node and prints the labels the agent
// writes on its Node under the agent's own flags, environment and config
// file (mig-strategy, time-slicing), one key=value a line, sorted. A
// discovery the agent would not relabel from (topology.LabelsComplete)
// still prints, says why on stderr and exits 1: the agent keeps the
// Node's labels as they are then.
func runTopologyLabels(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	const prog = "gpu-node-agent topology labels"
	cfg, code, ok := validConfig(prog, args, getenv, stderr)
	if !ok {
		return code
	}
	log := newLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	hw, err := openHardware(&cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		if errors.Is(err, errNoSimulator) {
			return 2
		}
		return 1
	}
	defer hw.Close()
	node, err := hw.Discover()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		return 1
	}
	gc := cfg.gpuConfig()
	labels := topology.Labels(node, gc.MIGStrategy, gc.TimeSlicing.LabelSharing())
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		fmt.Fprintf(stdout, "%s=%s\n", k, labels[k])
	}
	if why := topology.LabelsComplete(node); why != "" {
		fmt.Fprintf(stderr, "%s: discovery incomplete (%s): the agent keeps the Node's labels as they are\n", prog, why)
		return 1
	}
	return 0
}

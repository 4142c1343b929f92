package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// runTopologyPreferred implements `gpu-node-agent topology preferred`: it
// loads a snapshot, asks the solver for the preferred allocation and prints
// the chosen device IDs comma-separated on one line. With --explain it then
// prints the pair scores and the partition that justified the answer.
func runTopologyPreferred(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("topology preferred", flag.ContinueOnError)
	fs.SetOutput(stderr)
	snapshot := fs.String("snapshot", "", "topology snapshot `FILE` (as printed by `topology dump`)")
	available := fs.String("available", "", "comma-separated available device `IDs` (GPU or MIG UUIDs)")
	mustInclude := fs.String("must-include", "", "comma-separated device `IDs` the answer must hold")
	size := fs.Int("size", 0, "number of devices to allocate")
	explain := fs.Bool("explain", false, "also print the pair scores and the partition behind the answer")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gpu-node-agent topology preferred --snapshot FILE --available ID,... [--must-include ID,...] --size N [--explain]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *snapshot == "" {
		return errors.New("--snapshot is required")
	}
	if *available == "" {
		return errors.New("--available is required")
	}
	node, err := topology.LoadSnapshot(*snapshot)
	if err != nil {
		return err
	}
	a := topology.NewAllocator(node)
	e, err := a.Explain(splitIDs(*available), splitIDs(*mustInclude), *size)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, strings.Join(e.Chosen, ","))
	if *explain {
		return writeExplanation(stdout, e)
	}
	return nil
}

// splitIDs splits a comma-separated list, dropping blanks.
func splitIDs(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func writeExplanation(w io.Writer, e *topology.Explanation) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nrule:\t%s\n", e.Rule)
	fmt.Fprintf(tw, "size:\t%d\n", e.Size)
	if len(e.MustInclude) > 0 {
		fmt.Fprintf(tw, "must include:\t%s\n", strings.Join(e.MustInclude, ","))
	}
	if len(e.Skipped) > 0 {
		fmt.Fprintf(tw, "skipped (lost):\t%s\n", strings.Join(e.Skipped, ","))
	}
	fmt.Fprintf(tw, "chosen score:\t%d\n", e.ChosenScore)
	if e.Partition != nil {
		fmt.Fprintf(tw, "\npartition (total %d):\n", e.PartitionScore)
		for _, g := range e.Partition {
			note := ""
			if g.Leftover {
				note = "  (leftover)"
			}
			fmt.Fprintf(tw, "  %s\t%d%s\n", strings.Join(g.Devices, ","), g.Score, note)
		}
	}
	fmt.Fprintf(tw, "\npair scores:\n")
	for _, p := range e.Pairs {
		fmt.Fprintf(tw, "  %s\t%s\t%d\n", p.A, p.B, p.Score)
	}
	return tw.Flush()
}

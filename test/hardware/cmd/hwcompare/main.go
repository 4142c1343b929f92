// Command hwcompare holds what the agent saw and served in a hardware check
// kit capture against what nvidia-smi said there (package compare,
// test/hardware/README.md) and prints one line per disagreement, the
// explained ones, what it could not compare and why, and a summary line.
//
//	hwcompare [--explained FILE] [-v] CAPTURE_DIR
//
// Exit status: 0 when every disagreement is explained (or there is none),
// 1 when one is not, 2 on a bad command line or unreadable input.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/compare"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hwcompare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	explained := fs.String("explained", "", "`FILE` of known disagreements: a regular expression matching the line, then the reason, one per line")
	verbose := fs.Bool("v", false, "also print every comparison that agrees")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: hwcompare [--explained FILE] [-v] CAPTURE_DIR")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	var ex []compare.Explanation
	if *explained != "" {
		f, err := os.Open(*explained)
		if err != nil {
			fmt.Fprintf(stderr, "hwcompare: %v\n", err)
			return 2
		}
		ex, err = compare.ParseExplained(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(stderr, "hwcompare: %s: %v\n", *explained, err)
			return 2
		}
	}
	in, err := compare.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "hwcompare: cannot compare %s: %v\n", fs.Arg(0), err)
		return 2
	}
	r := compare.Compare(in)
	r.Explain(ex)
	if err := r.Write(stdout, *verbose); err != nil {
		fmt.Fprintf(stderr, "hwcompare: %v\n", err)
		return 2
	}
	return r.ExitCode()
}

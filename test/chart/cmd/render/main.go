// Command render copies the alerting rules into the chart and writes
// deploy/manifests from the Helm chart's default values (`make
// manifests`). Run it from the repository root, or pass the root as the
// only argument.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpu-node-agent/gpu-node-agent/test/chart"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	if err := run(root); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	if err := chart.CopyRules(root); err != nil {
		return err
	}
	fmt.Printf("copied %s to %s\n", chart.RulesFile, chart.ChartRulesFile)
	ch, err := chart.Load(filepath.Join(root, chart.ChartDir))
	if err != nil {
		return err
	}
	files, err := chart.Manifests(ch)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, chart.ManifestsDir)
	if err := chart.WriteManifests(dir, files); err != nil {
		return err
	}
	fmt.Printf("wrote %d manifests to %s\n", len(files), dir)
	return nil
}

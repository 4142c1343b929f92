// Command demo-cluster starts the e2e single-node cluster, installs the
// agent and a sample GPU pod, prints how to reach it and keeps it running
// until Ctrl-C, then stops everything.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

func main() {
	os.Exit(run())
}

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "demo-cluster: "+format+"\n", args...) }
	upCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	c, err := cluster.Up(upCtx, cluster.Options{Node: true, Log: logf})
	if err != nil {
		logf("start cluster: %v", err)
		return 1
	}
	defer func() {
		logf("stopping the cluster")
		if err := c.Stop(); err != nil {
			logf("stop: %v", err)
		}
	}()
	fmt.Printf("cluster is up: kubeconfig %s, logs in %s\nCtrl-C stops it.\n", c.Kubeconfig, c.LogDir)
	<-ctx.Done()
	return 0
}

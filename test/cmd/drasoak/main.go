// Command drasoak measures the agent's memory and CPU with its DRA driver
// serving: a real kube-apiserver (etcd and kube-apiserver on loopback, as
// the e2e cluster starts them, no kubelet), the agent built with the
// simulator on a simulated DGX H100 with two GPUs in seven MIG devices
// each, every device kind served through DRA (its ResourceSlices on the
// API server, its kubelet plugin's sockets up), GPU metrics collected
// every second and scraped every -scrape. It samples VmRSS from /proc
// every second for -duration and prints the peak, the last sample, the
// average CPU and the slices published.
//
//	drasoak -bin bin/gpu-node-agent-sim -duration 10m
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

const (
	nodeName = "soak-node"
	mig      = "1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"
)

func main() {
	bin := flag.String("bin", "", "the agent built with the simulator (required)")
	duration := flag.Duration("duration", 10*time.Minute, "how long to sample")
	scrape := flag.Duration("scrape", 15*time.Second, "how often /metrics is scraped")
	flag.Parse()
	if *bin == "" {
		fmt.Fprintln(os.Stderr, "drasoak: -bin is required")
		os.Exit(2)
	}
	if err := run(*bin, *duration, *scrape); err != nil {
		fmt.Fprintln(os.Stderr, "drasoak:", err)
		os.Exit(1)
	}
}

func run(bin string, duration, scrape time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), duration+5*time.Minute)
	defer cancel()
	c, err := cluster.Up(ctx, cluster.Options{})
	if err != nil {
		return err
	}
	defer c.Stop()
	if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node: %w", err)
	}

	dir, err := os.MkdirTemp("", "drasoak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A copy, as cp or an image unpack makes one: how the file was written
	// decides how many of its pages a fault maps.
	agent := filepath.Join(dir, "agent")
	if err := agentproc.CopyBinary(bin, agent); err != nil {
		return err
	}
	port, err := freeport.Get()
	if err != nil {
		return err
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`dra:
  devices: [gpu, mig, nic]
  kubeletDir: %s
  cdiDir: %s
metrics:
  interval: 1s
`, filepath.Join(dir, "kubelet"), filepath.Join(dir, "cdi"))), 0o600); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, agent, "--config", config,
		"--simulate", "dgx-h100,mig=0:"+mig+",mig=1:"+mig, "--sim-control-address", "",
		"--node-name", nodeName, "--kubeconfig", c.Kubeconfig,
		"--device-plugin-dir", filepath.Join(dir, "kubelet", "device-plugins"),
		"--state-dir", filepath.Join(dir, "state"),
		"--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	logf, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		<-exited
	}()
	agentLog := func() string { b, _ := os.ReadFile(logf.Name()); return string(b) }

	// Wait for the slices: the DRA driver is serving.
	var slices, devices int
	deadline := time.Now().Add(2 * time.Minute)
	for devices == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("no ResourceSlices after 2m; agent log:\n%s", agentLog())
		}
		select {
		case err := <-exited:
			return fmt.Errorf("agent exited: %v; log:\n%s", err, agentLog())
		case <-time.After(time.Second):
		}
		slices, devices, err = published(ctx, c)
		if err != nil {
			return err
		}
	}
	fmt.Printf("drasoak: %d devices in %d ResourceSlices on the API server\n", devices, slices)

	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	pid := cmd.Process.Pid
	t0, err := cpuTicks(pid)
	if err != nil {
		return err
	}
	start := time.Now()
	var maxRSS, rss int64
	var atMax memory
	scrapes, series := 0, 0
	nextScrape := start.Add(scrape)
	for time.Since(start) < duration {
		select {
		case err := <-exited:
			return fmt.Errorf("agent exited after %s: %v; log:\n%s", time.Since(start).Round(time.Second), err, agentLog())
		case <-time.After(time.Second):
		}
		m, err := readMemory(pid)
		if err != nil {
			return err
		}
		if rss = m.rss; rss > maxRSS {
			maxRSS, atMax = rss, m
		}
		if time.Now().After(nextScrape) {
			nextScrape = nextScrape.Add(scrape)
			if n, err := scrapeSeries(url); err == nil {
				scrapes++
				series = n
			}
		}
	}
	t1, err := cpuTicks(pid)
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	slices2, devices2, err := published(ctx, c)
	if err != nil {
		return err
	}
	fmt.Printf("drasoak: %s, GPU metrics every 1 s, %d scrapes, %d DCGM_ series per scrape, %d devices in %d ResourceSlices at the end\n",
		duration, scrapes, series, devices2, slices2)
	fmt.Printf("  max RSS   %.1f MiB (last %.1f MiB); at the peak RssAnon %.1f MiB, RssFile %.1f MiB\n",
		float64(maxRSS)/1024, float64(rss)/1024, float64(atMax.anon)/1024, float64(atMax.file)/1024)
	// USER_HZ is 100 on Linux.
	fmt.Printf("  avg CPU   %.2f%% of one core\n", 100*float64(t1-t0)/100/elapsed.Seconds())
	return nil
}

// published counts the node's ResourceSlices of the agent's driver and
// their devices.
func published(ctx context.Context, c *cluster.Cluster) (slices, devices int, err error) {
	l, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"spec.nodeName": nodeName, "spec.driver": dra.DriverName,
	}.AsSelector().String()})
	if err != nil {
		return 0, 0, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for _, s := range l.Items {
		devices += len(s.Spec.Devices)
	}
	return len(l.Items), devices, nil
}

func scrapeSeries(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "DCGM_FI_") {
			n++
		}
	}
	return n, nil
}

// memory is a process's resident memory in KiB (/proc/<pid>/status).
type memory struct{ rss, anon, file int64 }

func readMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || len(strings.Fields(v)) == 0 {
			continue
		}
		n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			m.rss = n
		case "RssAnon":
			m.anon = n
		case "RssFile":
			m.file = n
		}
	}
	if m.rss == 0 {
		return m, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	return m, nil
}

// cpuTicks is the process's user and system time in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, err
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	return u + s, err
}

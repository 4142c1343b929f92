//go:build simulator

package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// demoConfig is the demo's config file: one exclusive RDMA resource and a
// short recovery period, so an injected fault clears within the demo.
const demoConfig = `rdma:
  resources:
  - name: ib
    selectors:
      linkTypes: [infiniband]
health:
  recoveryPeriod: 20s
`

// demoSimulate is the node `make demo` shows: a DGX H100 whose GPU 0 is cut
// into four MIG devices of three sizes and GPU 1 into seven 1g.10gb ones.
const demoSimulate = "dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"

// kubeletSocketName is the kubelet's registration socket in the
// device-plugin directory; the agent uses the plugin package's default.
const kubeletSocketName = "kubelet.sock"

// runDemo runs the agent on the demo node with the mixed MIG strategy,
// sockets in a temporary directory and the inventory printed on stdout.
// There is no kubelet, so the inventory says what would be offered to one.
// args are agent flags and override the demo's.
func runDemo(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	dir, err := os.MkdirTemp("", "gpu-node-agent-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent demo: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// RDMA resources exist only in the config file; the demo's serves the
	// simulated ConnectX-7 InfiniBand ports as rdma/ib.
	config := filepath.Join(dir, "demo.yaml")
	if err := os.WriteFile(config, []byte(demoConfig), 0o600); err != nil {
		fmt.Fprintf(stderr, "gpu-node-agent demo: %v\n", err)
		return 1
	}
	all, banner := demoPlan(append(demoArgs(dir, config), args...), getenv)
	io.WriteString(stdout, banner)
	return run(all, stdout, stderr, getenv)
}

// demoPlan returns the agent's arguments, with any port 0 pinned, and the
// banner naming what the agent will use. It reads the settings as the agent
// will (flags, env, config file). A bad setting gets no banner: run
// reports it (with the usage, for --help).
func demoPlan(args []string, getenv func(string) string) ([]string, string) {
	cfg, err := loadConfig(args, getenv, io.Discard)
	if err != nil || cfg.Validate() != nil {
		return args, ""
	}
	cfg, pinned := pinPorts(cfg)
	var b strings.Builder
	writeDemoBanner(&b, cfg)
	return append(slices.Clip(args), pinned...), b.String()
}

// demoArgs are the demo's agent flags, before the user's.
func demoArgs(dir, config string) []string {
	return []string{
		"--config", config,
		"--simulate", demoSimulate,
		"--mig-strategy", "mixed",
		"--device-plugin-dir", dir,
		"--print-inventory",
		"--metrics-address", "127.0.0.1:9400",
		"--sim-control-address", "127.0.0.1:9402",
	}
}

// pinPorts replaces port 0 in the endpoints the agent will serve with a
// port free now, and returns the flags that make the agent use it. The
// banner is written before the agent listens, and a kernel-chosen port is
// known only once bound: binding here first lets the banner name the port
// the agent then listens on. (Another process taking that port in between
// makes the agent fail to start with "address already in use", not serve
// elsewhere.)
func pinPorts(cfg Config) (Config, []string) {
	var flags []string
	pin := func(name string, addr *string) {
		host, port, err := net.SplitHostPort(*addr)
		if err != nil || port != "0" {
			return
		}
		l, err := net.Listen("tcp", *addr)
		if err != nil {
			return // the agent's own listen reports it
		}
		_, bound, _ := net.SplitHostPort(l.Addr().String())
		l.Close()
		*addr = net.JoinHostPort(host, bound)
		flags = append(flags, "--"+name, *addr)
	}
	if cfg.MetricsAddress != "" {
		pin("metrics-address", &cfg.MetricsAddress)
	}
	if cfg.Simulate != "" && cfg.SimControlAddress != "" {
		pin("sim-control-address", &cfg.SimControlAddress)
	}
	return cfg, flags
}

// writeDemoBanner says what the demo runs and every address it uses, as
// configured (flags, env, config file) with ports already pinned, and how
// to change the simulated node while it runs.
func writeDemoBanner(w io.Writer, cfg Config) {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }

	demoNode := cfg.Simulate == demoSimulate
	switch {
	case demoNode:
		p("gpu-node-agent demo: a simulated DGX H100 (8 GPUs, 2 NUMA nodes) with MIG on GPUs 0 and 1,\n")
	case cfg.Simulate != "":
		p("gpu-node-agent demo: a simulated node (--simulate %s),\n", cfg.Simulate)
	default:
		p("gpu-node-agent demo: this machine's own GPUs (no --simulate),\n")
	}
	p("served with --mig-strategy %s.\n\n", cfg.MIGStrategy)

	dir := cfg.DevicePluginDir
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	p("Addresses in use:\n")
	if cfg.MetricsAddress == "" {
		p("  metrics            off (--metrics-address is empty)\n")
	} else {
		scheme := "http://"
		if cfg.Metrics.WebConfigFile != "" {
			scheme = "" // TLS and auth as the web config file says
		}
		p("  metrics            %s%s/metrics (also /healthz, /readyz)\n", scheme, dialable(cfg.MetricsAddress))
	}
	control := ""
	switch {
	case cfg.Simulate == "":
	case cfg.SimControlAddress == "":
		p("  simulator control  off (--sim-control-address is empty)\n")
	default:
		control = dialable(cfg.SimControlAddress)
		p("  simulator control  http://%s (POST /mig, POST|DELETE /faults, GET /state)\n", control)
	}
	p("  device plugins     %s, one per resource\n", filepath.Join(dir, "gpu-node-agent-<resource>.sock"))
	p("  kubelet socket     %s\n", filepath.Join(dir, kubeletSocketName))
	p("                     (no kubelet here: the log says so once, then the agent retries quietly)\n")
	if names := rdmaNames(cfg.RDMA); len(names) > 0 {
		p("  RDMA resources     %s\n", strings.Join(names, ", "))
	}
	if cfg.PrintInventory {
		p("\nWhat the agent would offer a kubelet is printed below, again on every change.\n")
	}
	if control != "" {
		writeDemoTry(&b, cfg, control, demoNode)
	}
	p("Ctrl-C stops it.\n\n")
	io.WriteString(w, b.String())
}

// writeDemoTry lists simulator requests to try. The MIG layouts and GPU
// numbers fit the demo's DGX H100; another node gets GPU 0 examples.
func writeDemoTry(b *strings.Builder, cfg Config, control string, demoNode bool) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	recovery := cfg.Health.WithDefaults().RecoveryPeriod
	if !demoNode {
		p("While it runs, try (GPU numbers are the simulated node's):\n")
		p("  curl -s -X POST %s/faults -d '{\"kind\":\"xid\",\"gpu\":0,\"xid\":79}'\n", control)
		p("  curl -s -X POST %s/faults -d '{\"kind\":\"gpu-reset\",\"gpu\":0}'\n", control)
		p("After the reset the GPU is healthy again %s (health.recoveryPeriod) later.\n", recovery)
		return
	}
	p("While it runs, try:\n")
	p("  curl -s -X POST %s/mig -d '{\"gpu\":1,\"profiles\":[\"3g.40gb\",\"3g.40gb\"]}'\n", control)
	p("  curl -s -X POST %s/mig -d '{\"gpu\":0,\"profiles\":[]}'\n", control)
	p("A fault: GPU 3 reports XID 79 (fallen off the bus). The GPU turns UNHEALTHY and the node\n")
	p("UNFIT, and it stays so until the GPU is reset (a reset-class XID never clears on a timer);\n")
	p("after the reset it is healthy again %s (health.recoveryPeriod) later:\n", recovery)
	p("  curl -s -X POST %s/faults -d '{\"kind\":\"xid\",\"gpu\":3,\"xid\":79}'\n", control)
	p("  curl -s -X POST %s/faults -d '{\"kind\":\"gpu-reset\",\"gpu\":3}'\n", control)
	p("An XID that asks for no reset (74, NVLink) is an event: healthy again %s later.\n", recovery)
	p("Lasting faults (gpu-lost, nvlink-down, ecc-dbe, ...) are cleared with DELETE and the same body:\n")
	p("  curl -s -X POST %s/faults -d '{\"kind\":\"gpu-lost\",\"gpu\":5}'\n", control)
	p("  curl -s -X DELETE %s/faults -d '{\"kind\":\"gpu-lost\",\"gpu\":5}'\n", control)
}

// dialable is a listen address as a client reaches it from this machine:
// an empty or unspecified host (all interfaces) becomes loopback.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch ip := net.ParseIP(host); {
	case host == "":
		host = "127.0.0.1"
	case ip != nil && ip.IsUnspecified() && ip.To4() == nil:
		host = "::1"
	case ip != nil && ip.IsUnspecified():
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// rdmaNames are the configured RDMA resource names, as the kubelet sees them.
func rdmaNames(c rdma.Config) []string {
	var out []string
	for _, r := range c.Resources {
		out = append(out, rdma.ResourcePrefix+r.Name)
	}
	return out
}

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// demoSimulate is the node `make demo` shows: a DGX H100 whose GPU 0 is cut
// into four MIG devices of three sizes and GPU 1 into seven 1g.10gb ones.
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

const demoSimulate = "dgx-h100,mig=0:3g.40gb+2g.20gb+1g.10gb+1g.10gb,mig=1:1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb+1g.10gb"

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

	fmt.Fprintf(stdout, `gpu-node-agent demo: a simulated DGX H100 (8 GPUs, 2 NUMA nodes) with MIG on GPUs 0 and 1,
served with --mig-strategy mixed. Device-plugin sockets are in %s.
There is no kubelet here, so the log's registration retries are expected; what the agent
would offer a kubelet is printed below, again on every change. While it runs, try:
  curl -s -X POST 127.0.0.1:9402/mig -d '{"gpu":1,"profiles":["3g.40gb","3g.40gb"]}'
  curl -s -X POST 127.0.0.1:9402/mig -d '{"gpu":0,"profiles":[]}'
A fault: GPU 3 reports XID 79 (fallen off the bus). The GPU turns UNHEALTHY and the node
UNFIT, and it stays so until the GPU is reset (a reset-class XID never clears on a timer);
after the reset it is healthy again 20s (health.recoveryPeriod) later:
  curl -s -X POST 127.0.0.1:9402/faults -d '{"kind":"xid","gpu":3,"xid":79}'
  curl -s -X POST 127.0.0.1:9402/faults -d '{"kind":"gpu-reset","gpu":3}'
An XID that asks for no reset (74, NVLink) is an event: healthy again 20s later.
Lasting faults (gpu-lost, nvlink-down, ecc-dbe, ...) are cleared with DELETE and the same body:
  curl -s -X POST 127.0.0.1:9402/faults -d '{"kind":"gpu-lost","gpu":5}'
  curl -s -X DELETE 127.0.0.1:9402/faults -d '{"kind":"gpu-lost","gpu":5}'
RDMA: the simulated InfiniBand ports are served as rdma/ib; metrics are on 127.0.0.1:9400/metrics.
Ctrl-C stops it.

`, dir)
	demo := []string{
		"--config", config,
		"--simulate", demoSimulate,
		"--mig-strategy", "mixed",
		"--device-plugin-dir", dir,
		"--print-inventory",
		"--metrics-address", "127.0.0.1:9400",
		"--sim-control-address", "127.0.0.1:9402",
	}
	return run(append(demo, args...), stdout, stderr, getenv)
}

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/safeguard"
	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

const l2NS = "fleetsim-l2"

// l2Config is the agents' config file: the safeguard counts only this
// fleet; a short poll and recovery period (and no flap damping) so a
// cleared fault recovers within seconds, as in the demo.
const l2Config = `taint:
  maxFraction: %g
  nodeSelector: %s=l2
  leaseNamespace: %s
health:
  pollInterval: 2s
  recoveryPeriod: 2s
  flapWindow: 1ms
`

// gpuLost is the injected fault: GPU 0 falls off the bus (XID 79, calls
// fail with ERROR_GPU_IS_LOST). Its DELETE stands for the GPU's reset.
const gpuLost = `{"kind":"gpu-lost","gpu":0}`

type agentProc struct {
	name    string
	control string
	cmd     *exec.Cmd
	done    chan struct{}
}

type level2Result struct {
	procs, limit int
	rssMiB       float64
	startupTime  time.Duration
	waves        [][2]phaseResult
	violation    bool
}

// runLevel2 runs o.procs real agent processes in simulate mode against
// the API server and injects a GPU loss into o.l2Faults of them at once.
func runLevel2(ctx context.Context, c *cluster.Cluster, o options) (*level2Result, error) {
	admin, err := adminClient(c)
	if err != nil {
		return nil, err
	}
	if err := createNamespace(ctx, admin, l2NS); err != nil {
		return nil, err
	}
	names := make([]string, o.procs)
	for i := range names {
		names[i] = fmt.Sprintf("l2-node-%02d", i)
	}
	if err := createNodes(ctx, admin, names, "l2"); err != nil {
		return nil, err
	}
	obs, err := startObserver(ctx, admin, fleetLabel+"=l2", l2NS)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fleetsim-l2-")
	if err != nil {
		return nil, fmt.Errorf("level 2 dir: %w", err)
	}
	defer func() {
		if os.Getenv("GNA_E2E_KEEP") == "" {
			os.RemoveAll(dir)
		} else {
			logf("level 2: agent logs kept in %s", dir)
		}
	}()
	config := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, l2Config, o.maxFraction, fleetLabel, l2NS), 0o600); err != nil {
		return nil, fmt.Errorf("level 2 config: %w", err)
	}

	start := time.Now()
	procs := make([]*agentProc, o.procs)
	defer func() { stopAgents(procs) }()
	for i, name := range names {
		p, err := startAgent(o.agentBin, dir, name, config, c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		procs[i] = p
	}
	if err := awaitControl(ctx, procs, 3*time.Minute); err != nil {
		return nil, err
	}
	if _, ok := obs.wait(ctx, 3*time.Minute, func(st *state) bool { return st.condIs(names, corev1.ConditionTrue) }); !ok {
		return nil, fmt.Errorf("level 2: not every agent set %s=True within 3m (logs in %s)", conditionType, dir)
	}
	res := &level2Result{procs: o.procs, limit: safeguard.Limit(o.procs, o.maxFraction), startupTime: time.Since(start)}
	logf("level 2: %d agents up (condition True on every Node) in %s", o.procs, res.startupTime.Round(time.Millisecond))
	// Let start-up writes (labels, conditions) finish before measuring.
	time.Sleep(3 * time.Second)
	res.rssMiB = rssMiB(procs)

	for rep := range o.reps2 {
		idx := rand.Perm(o.procs)[:o.l2Faults]
		faulted := make([]*agentProc, len(idx))
		fnames := make([]string, len(idx))
		for i, j := range idx {
			faulted[i], fnames[i] = procs[j], names[j]
		}
		want := min(res.limit, len(faulted))
		obs.phase(want)
		apiBefore, err := apiserverRequests(ctx, admin)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := control(ctx, faulted, http.MethodPost, gpuLost); err != nil {
			return nil, err
		}
		_, complete := obs.wait(ctx, o.settle, func(st *state) bool {
			return st.condIs(fnames, corev1.ConditionFalse) && len(st.tainted) >= want
		})
		f := phaseResult{faulted: len(faulted), limit: res.limit, toLimit: -1, settled: time.Since(t0), complete: complete}
		time.Sleep(3 * time.Second) // refusals' events and re-asks
		st := obs.snapshot()
		f.tainted, f.max, f.leasesLeft = len(st.tainted), st.max, len(st.leases)
		f.refused = len(faulted) - st.taintedAmong(fnames)
		if !st.reached.IsZero() {
			f.toLimit = st.reached.Sub(t0)
		}
		apiAfter, err := apiserverRequests(ctx, admin)
		if err != nil {
			return nil, err
		}
		f.api = apiAfter.Minus(apiBefore).Without("WATCH")
		if f.max > res.limit || f.tainted < 1 {
			res.violation = true
		}
		logf("level 2 rep %d fault: %d faulted, %d tainted (max %d, limit %d), to limit %s, %d apiserver requests",
			rep+1, f.faulted, f.tainted, f.max, f.limit, fmtDur(f.toLimit), f.api.Requests())

		obs.phase(0)
		apiBefore, err = apiserverRequests(ctx, admin)
		if err != nil {
			return nil, err
		}
		t0 = time.Now()
		if err := control(ctx, faulted, http.MethodDelete, gpuLost); err != nil {
			return nil, err
		}
		r, err := awaitRecovery(ctx, obs, fnames, t0, o.clearWait)
		if err != nil {
			return nil, err
		}
		r.recovered = "DELETE (reset evidence)"
		if !r.complete {
			// The DELETE did not end the held fault: the operator's
			// clear-faults annotation does.
			r.recovered = "DELETE + clear-faults annotation"
			if err := annotateClear(ctx, admin, fnames); err != nil {
				return nil, err
			}
			r, err = awaitRecovery(ctx, obs, fnames, t0, o.clearWait+o.settle)
			if err != nil {
				return nil, err
			}
		}
		time.Sleep(3 * time.Second)
		apiAfter, err = apiserverRequests(ctx, admin)
		if err != nil {
			return nil, err
		}
		r.api = apiAfter.Minus(apiBefore).Without("WATCH")
		logf("level 2 rep %d recovery (%s): untainted in %s, settled in %s, %d leases left",
			rep+1, r.recovered, fmtDur(r.untainted), fmtDur(r.settled), r.leasesLeft)
		res.waves = append(res.waves, [2]phaseResult{f, r})
		if !r.complete {
			return res, fmt.Errorf("level 2 rep %d: fleet did not recover (logs in %s)", rep+1, dir)
		}
	}
	return res, nil
}

func startAgent(bin, dir, name, config, kubeconfig string) (*agentProc, error) {
	port, err := freeport.Get()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, name)
	dp := filepath.Join(root, "device-plugins")
	if err := os.MkdirAll(dp, 0o755); err != nil {
		return nil, fmt.Errorf("agent %s dirs: %w", name, err)
	}
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("agent %s log: %w", name, err)
	}
	control := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin,
		"--config", config,
		"--simulate", "dgx-h100",
		"--host-root", root,
		"--device-plugin-dir", dp,
		"--node-name", name,
		"--kubeconfig", kubeconfig,
		"--sim-control-address", control,
		"--metrics-address", "",
		"--log-level", "info",
	)
	cmd.Stdout, cmd.Stderr = log, log
	// Nothing from this environment may override the config file.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "GNA_") && !strings.HasPrefix(e, "POD_NAMESPACE=") && !strings.HasPrefix(e, "NODE_NAME=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start agent %s (%s): %w", name, bin, err)
	}
	p := &agentProc{name: name, control: "http://" + control, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// stopAgents sends SIGTERM to every agent and SIGKILL to those still
// running 15 s later.
func stopAgents(procs []*agentProc) {
	for _, p := range procs {
		if p != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(15 * time.Second)
	for _, p := range procs {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
		case <-deadline:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
}

var httpClient = &http.Client{Timeout: 10 * time.Second}

// awaitControl waits until every agent's simulator control endpoint
// answers.
func awaitControl(ctx context.Context, procs []*agentProc, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, p := range procs {
		for {
			select {
			case <-p.done:
				return fmt.Errorf("agent %s exited at start", p.name)
			default:
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.control+"/state", nil)
			resp, err := httpClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("agent %s control endpoint not up within %s", p.name, timeout)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return nil
}

// control sends body to every agent's /faults at the same instant (each
// request on its own goroutine, released together).
func control(ctx context.Context, procs []*agentProc, method, body string) error {
	go1 := make(chan struct{})
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		req, err := http.NewRequestWithContext(ctx, method, p.control+"/faults", bytes.NewBufferString(body))
		if err != nil {
			return fmt.Errorf("fault request: %w", err)
		}
		req.Header.Set("Content-Type", "application/json")
		wg.Go(func() {
			<-go1
			resp, err := httpClient.Do(req)
			if err != nil {
				errs[i] = fmt.Errorf("%s %s/faults: %w", method, p.name, err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				var msg bytes.Buffer
				_, _ = msg.ReadFrom(resp.Body)
				errs[i] = fmt.Errorf("%s %s/faults: %s: %s", method, p.name, resp.Status, strings.TrimSpace(msg.String()))
			}
		})
	}
	close(go1)
	wg.Wait()
	return errors.Join(errs...)
}

// annotateClear sets the operator's clear-faults annotation (all) on
// each named Node.
func annotateClear(ctx context.Context, c kubernetes.Interface, names []string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{kubeapi.ClearFaultsAnnotation: "all"}}})
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := c.CoreV1().Nodes().Patch(ctx, n, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("annotate node %s: %w", n, err)
		}
	}
	return nil
}

// rssMiB sums the agents' resident memory.
func rssMiB(procs []*agentProc) float64 {
	var kb int64
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				kb += v
			}
		}
	}
	return float64(kb) / 1024
}

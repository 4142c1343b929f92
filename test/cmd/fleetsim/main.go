// Command fleetsim measures the node agents' load on a real kube-apiserver
// and checks the fleet safeguard at fleet scale, on loopback (Debian etcd
// and the kube-apiserver the e2e harness builds, cluster.KubeVersion):
//
//   - Level 1: N agents' API side in this process (per node its own
//     clients and TLS transport, NodeWatch and Tainter, a fitness it
//     flips): steady-state requests, then R mass faults of a fraction of
//     the fleet at one instant and their recovery. With -identity=token
//     (the default) every agent has its node's own identity, as the
//     DaemonSet pod does: the chart's rendered service account, RBAC and
//     ValidatingAdmissionPolicy are applied, and each agent authenticates
//     with a service-account token bound to a Pod on its node (so it
//     carries the node-name extra the policy confines it with); its slot
//     Leases and Events go to the namespaces the policy allows. Any
//     request refused (by the policy, RBAC or authentication) is counted,
//     reported and fails the run. -identity=cert gives every agent the
//     admin client certificate instead.
//   - Level 2: real agent processes in simulate mode; a GPU loss injected
//     into some of them at one instant through the simulator's control
//     endpoint, then cleared.
//
// It prints a markdown report (and writes it to -out) and exits non-zero
// if more Nodes than the safeguard's limit were ever tainted or any agent
// request was refused.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/gpu-node-agent/gpu-node-agent/test/e2e/cluster"
)

type options struct {
	nodes, reps                int
	procs, reps2, l2Faults     int
	maxFraction, faultFraction float64
	steady, resync, settle     time.Duration
	clearWait                  time.Duration
	agentBin, out              string
	identity                   string
	apiserverArgs              []string
}

func main() { os.Exit(run()) }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "fleetsim: "+format+"\n", args...)
}

// logSink receives the simulated agents' warnings.
func logSink() io.Writer { return os.Stderr }

func run() int {
	var o options
	flag.IntVar(&o.nodes, "n", 1000, "level 1: simulated agents in this process (0 skips level 1)")
	flag.IntVar(&o.reps, "r", 3, "level 1: mass fault + recovery repetitions")
	flag.IntVar(&o.procs, "procs", 40, "level 2: real agent processes (0 skips level 2)")
	flag.IntVar(&o.reps2, "r2", 3, "level 2: fault + recovery repetitions")
	flag.IntVar(&o.l2Faults, "l2-faults", 0, "level 2: agents a GPU loss is injected into at once (0: half of -procs)")
	flag.Float64Var(&o.maxFraction, "max-fraction", 0.2, "taint.maxFraction of every agent")
	flag.Float64Var(&o.faultFraction, "fault-fraction", 0.3, "level 1: fraction of the fleet flipped unfit at once")
	flag.DurationVar(&o.steady, "steady", time.Minute, "level 1: steady-state measuring window")
	flag.DurationVar(&o.resync, "resync", 5*time.Minute, "level 1: taint.resync (node informer resync)")
	flag.DurationVar(&o.settle, "settle", 3*time.Minute, "longest wait for a fault or recovery wave to settle")
	flag.DurationVar(&o.clearWait, "clear-wait", time.Minute, "level 2: wait after DELETE of the fault before the clear-faults annotation is used")
	flag.StringVar(&o.agentBin, "agent-bin", os.Getenv("GPU_NODE_AGENT_BIN"), "agent binary built with the simulator (default <repo>/bin/gpu-node-agent-sim)")
	flag.StringVar(&o.out, "out", "", "also write the markdown report to this file")
	flag.Func("apiserver-arg", "a kube-apiserver flag added to the cluster's (repeatable), e.g. -apiserver-arg=--max-mutating-requests-inflight=5000", func(v string) error {
		o.apiserverArgs = append(o.apiserverArgs, v)
		return nil
	})
	flag.StringVar(&o.identity, "identity", identityToken, "level 1: the agents' identity: token (per node a service-account token bound to a Pod on it,"+
		" under the chart's RBAC and admission policy) or cert (the admin client certificate)")
	flag.Parse()
	if o.l2Faults <= 0 || o.l2Faults > o.procs {
		o.l2Faults = o.procs / 2
	}
	if o.identity != identityToken && o.identity != identityCert {
		logf("-identity must be %s or %s", identityToken, identityCert)
		return 2
	}
	if o.faultFraction <= 0 || o.faultFraction > 1 || o.maxFraction <= 0 || o.maxFraction > 1 {
		logf("-fault-fraction and -max-fraction must be within (0, 1]")
		return 2
	}
	if o.agentBin == "" {
		o.agentBin = filepath.Join(cluster.RepoRoot(), "bin", "gpu-node-agent-sim")
	}
	// client-go's own logs (throttling notes) would drown the progress.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	upCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	c, err := cluster.Up(upCtx, cluster.Options{Log: logf, APIServerArgs: o.apiserverArgs})
	cancel()
	if err != nil {
		logf("start etcd + kube-apiserver: %v", err)
		return 1
	}
	defer func() {
		if err := c.Stop(); err != nil {
			logf("stop: %v", err)
		}
	}()

	var (
		l1    *level1Result
		l2    *level2Result
		fails []error
	)
	if o.nodes > 0 {
		if l1, err = runLevel1(ctx, c, o); err != nil {
			fails = append(fails, fmt.Errorf("level 1: %w", err))
		}
	}
	if o.procs > 0 && ctx.Err() == nil {
		if _, err := os.Stat(o.agentBin); err != nil {
			fails = append(fails, fmt.Errorf("level 2: agent binary: %w (make build)", err))
		} else if l2, err = runLevel2(ctx, c, o); err != nil {
			fails = append(fails, fmt.Errorf("level 2: %w", err))
		}
	}
	report := renderReport(o, l1, l2)
	fmt.Print(report)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(report), 0o644); err != nil {
			fails = append(fails, fmt.Errorf("write report: %w", err))
		}
	}
	if l1 != nil && l1.violation {
		fails = append(fails, fmt.Errorf("level 1: more Nodes tainted than the limit %d", l1.limit))
	}
	if l1 != nil && len(l1.watchLeaks) > 0 {
		fails = append(fails, fmt.Errorf("level 1: watches of slot Leases outlived their need: %s", strings.Join(l1.watchLeaks, "; ")))
	}
	if l1 != nil && l1.total.DeniedTotal() > 0 {
		fails = append(fails, fmt.Errorf("level 1: %d agent requests refused: %s", l1.total.DeniedTotal(), l1.total.DescribeDenied()))
	}
	if l2 != nil && l2.violation {
		fails = append(fails, fmt.Errorf("level 2: tainted count outside 1..%d", l2.limit))
	}
	if err := errors.Join(fails...); err != nil {
		logf("FAIL: %v", err)
		return 1
	}
	return 0
}

// adminClient is the admin's clientset with a rate limit high enough to
// create a fleet quickly.
func adminClient(c *cluster.Cluster) (kubernetes.Interface, error) {
	rc := rest.CopyConfig(c.RESTConfig)
	rc.QPS, rc.Burst, rc.UserAgent = 500, 1000, "fleetsim/admin"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return cs, nil
}

func createNamespace(ctx context.Context, c kubernetes.Interface, name string) error {
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}

// createNodes creates the named Nodes labelled as fleet, 16 at a time.
func createNodes(ctx context.Context, c kubernetes.Interface, names []string, fleet string) error {
	work := make(chan string)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for w := range errs {
		wg.Go(func() {
			for name := range work {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{fleetLabel: fleet}}}
				if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil && errs[w] == nil {
					errs[w] = fmt.Errorf("create node %s: %w", name, err)
				}
			}
		})
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// tokenExpiry is how long the level-1 agents' tokens are valid: an hour,
// or the longest the run may take plus a margin (the agents' tokens are
// static: nothing refreshes them as the kubelet does the pod's).
func tokenExpiry(o options) time.Duration {
	return max(time.Hour, o.steady+time.Duration(2*o.reps)*o.settle+30*time.Minute)
}

func fmtDur(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

// Package cluster starts a real single-node Kubernetes cluster on loopback
// for tests and the demo: Debian's etcd, kube-apiserver, controller-manager,
// scheduler and kubelet built from k8s.io/kubernetes, containerd 2.x built
// from the Go module proxy, and Debian's runc.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options say what to run.
type Options struct {
	// Node adds containerd and a kubelet (and the controller-manager and
	// scheduler); without it only etcd and kube-apiserver run.
	Node bool
	// NodeName is the kubelet's node name (default "e2e-node").
	NodeName string
	// NodeLabels are set by the kubelet when it registers the node.
	NodeLabels map[string]string
	// Dir is where state, logs and sockets go (default: a new dir in /tmp,
	// kept short because unix socket paths are limited to 108 bytes).
	Dir string
	// Log receives progress lines (default: discarded).
	Log func(format string, args ...any)
	// APIServerArgs are more kube-apiserver flags, after (and so
	// overriding) the cluster's own.
	APIServerArgs []string
}

// Cluster is a running cluster.
type Cluster struct {
	// Dir holds everything the cluster writes; LogDir the component logs.
	Dir, LogDir string
	// Kubeconfig is an admin (system:masters) kubeconfig file.
	Kubeconfig    string
	APIServerURL  string
	APIServerPort int
	RESTConfig    *rest.Config
	Client        kubernetes.Interface
	NodeName      string
	// ContainerdSocket is the containerd the kubelet uses.
	ContainerdSocket string

	opts    Options
	bins    binaries
	pki     *pki
	etcdURL string
	ownDir  bool

	mu                sync.Mutex
	etcd, apiserver   *process
	controllerManager *process
	scheduler         *process
	containerd        *process
	kubelet           *process
	kubeletArgs       []string
	kubeletHealthz    string
	nodeIPAdded       bool
	cdiDirExisted     bool
	extra             []*process // started on demand (prometheus)
	limitations       []string
	stopped           bool
}

// Up starts the cluster and waits until it is usable: the apiserver is
// ready and, with Options.Node, the node is Ready. On error everything
// started so far is stopped.
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.NodeName == "" {
		opts.NodeName = "e2e-node"
	}
	if opts.Log == nil {
		opts.Log = func(string, ...any) {}
	}
	bins, err := findBinaries(opts.Node)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, bins: bins, NodeName: opts.NodeName, Dir: opts.Dir}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", "gna-e2e-"); err != nil {
			return nil, fmt.Errorf("create cluster dir: %w", err)
		}
		c.ownDir = true
	}
	c.LogDir = filepath.Join(c.Dir, "logs")
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	if err := c.up(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

func (c *Cluster) up(ctx context.Context) error {
	var err error
	if c.pki, err = newPKI(filepath.Join(c.Dir, "pki"), c.NodeName); err != nil {
		return err
	}
	steps := []struct {
		name string
		run  func(context.Context) error
		node bool
	}{
		{"etcd", c.startEtcd, false},
		{"kube-apiserver", c.startAPIServer, false},
		{"kube-controller-manager", c.startControllerManager, true},
		{"kube-scheduler", c.startScheduler, true},
		{"node IP", c.setupNodeIP, true},
		{"containerd", c.startContainerd, true},
		{"pause image", c.importPause, true},
		{"kubelet", c.StartKubelet, true},
	}
	for _, s := range steps {
		if s.node && !c.opts.Node {
			continue
		}
		start := time.Now()
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("start %s: %w", s.name, err)
		}
		c.opts.Log("%s ready in %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// Start starts a cluster for a test and stops it when the test ends (also
// when it fails); on failure the component logs' tails go to the test log.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Log == nil {
		opts.Log = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Up(ctx, opts)
	if err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(t.Logf, 40)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return c
}

// StartAPIServer runs only etcd and kube-apiserver (Node,RBAC
// authorization, no kubelet) and returns an admin kubeconfig path and a
// stop function; the test's cleanup also stops it.
func StartAPIServer(t testing.TB) (kubeconfig string, stop func()) {
	t.Helper()
	c := Start(t, Options{})
	return c.Kubeconfig, func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop apiserver: %v", err)
		}
	}
}

// DumpLogs prints the last lines of every component log.
func (c *Cluster) DumpLogs(logf func(string, ...any), lines int) {
	entries, err := os.ReadDir(c.LogDir)
	if err != nil {
		logf("read logs: %v", err)
		return
	}
	for _, e := range entries {
		logf("--- %s (last %d lines):\n%s", e.Name(), lines, tailFile(filepath.Join(c.LogDir, e.Name()), lines))
	}
}

// Stop stops every component in reverse start order, removes what they
// mounted and, unless the directory was given in Options or
// GNA_E2E_KEEP is set, deletes the cluster directory. Safe to call twice.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()

	var errs []error
	for _, p := range c.extra {
		errs = append(errs, p.stop(10*time.Second))
	}
	if c.kubelet != nil {
		errs = append(errs, c.StopKubelet())
	}
	if c.containerd != nil {
		errs = append(errs, c.stopContainerd())
	}
	// The control plane is the harness, not what is tested: one that
	// needs SIGKILL (once, a kube-apiserver took over 15 s to drain after
	// every test had passed) is still stopped, and its log tail is shown
	// so the reason can be read, but it does not fail the run.
	for _, p := range []*process{c.scheduler, c.controllerManager, c.apiserver, c.etcd} {
		if err := p.stop(30 * time.Second); err != nil {
			c.opts.Log("NOTE: %v; last lines of %s:\n%s", err, p.logPath, tailFile(p.logPath, 20))
		}
	}
	if c.opts.Node {
		errs = append(errs, c.cleanupNode(), c.removeNodeIP())
	}
	if c.ownDir && os.Getenv("GNA_E2E_KEEP") == "" {
		errs = append(errs, unmountUnder(c.Dir))
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove cluster dir: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Limitations lists where this environment made the harness deviate from
// a stock node (empty on a normal machine).
func (c *Cluster) Limitations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.limitations...)
}

func (c *Cluster) note(msg string) {
	c.mu.Lock()
	c.limitations = append(c.limitations, msg)
	c.mu.Unlock()
	c.opts.Log("NOTE: %s", msg)
}

// repoRoot is the repository root (the parent of the test module).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	// file is <root>/test/e2e/cluster/cluster.go
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// RepoRoot is the repository root, for tests that need deploy/ or bin/.
func RepoRoot() string { return repoRoot() }

// lookPath finds a host binary and names the Debian package to install.
func lookPath(name, pkg string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found (apt-get install -y %s, or `make e2e-deps`): %w", name, pkg, err)
	}
	return p, nil
}

// ctrCommand runs ctr against the cluster's containerd in the k8s.io
// namespace.
func (c *Cluster) ctrCommand(ctx context.Context, args ...string) (string, error) {
	full := append([]string{"--address", c.ContainerdSocket, "--namespace", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, c.bins.ctr, full...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

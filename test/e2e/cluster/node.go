package cluster

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

const (
	// KubeletRootDir is the kubelet's root directory. The kubelet's device
	// manager hardcodes /var/lib/kubelet/device-plugins, and the agent's
	// DaemonSet mounts the host's /var/lib/kubelet paths, so the node uses
	// the real location; Stop unmounts and removes what it left there.
	KubeletRootDir = "/var/lib/kubelet"
	// DevicePluginDir is where the kubelet serves kubelet.sock.
	DevicePluginDir = KubeletRootDir + "/device-plugins"
	// PluginsDir and PluginsRegistryDir are the kubelet's plugin
	// directories (DRA drivers' sockets and their registration sockets);
	// they go with KubeletRootDir.
	PluginsDir         = KubeletRootDir + "/plugins"
	PluginsRegistryDir = KubeletRootDir + "/plugins_registry"
	// CDIDir is the host's directory for transient CDI specs, one of
	// containerd's cdi_spec_dirs: the agent's DRA driver writes a spec
	// per prepared claim there.
	CDIDir = "/var/run/cdi"
	// cdiVendorPrefix starts the file names of the specs the agent writes
	// (vendor gpu-node-agent.io: "gpu-node-agent.io-claim_<uid>.json"),
	// the only ones the harness removes from CDIDir.
	cdiVendorPrefix = "gpu-node-agent.io-"
	// NodeIP is the node's InternalIP, added to the loopback interface:
	// the kubelet refuses a 127/8 node IP, and the API server reaches the
	// kubelet (logs, exec) at the node's address. An address on lo carries
	// no traffic off the machine; 192.0.2.0/24 is TEST-NET-1.
	NodeIP = "192.0.2.10"
)

// setupNodeIP adds NodeIP to the loopback interface.
func (c *Cluster) setupNodeIP(ctx context.Context) error {
	ip, err := lookPath("ip", "iproute2")
	if err != nil {
		return err
	}
	_ = exec.CommandContext(ctx, ip, "addr", "del", NodeIP+"/32", "dev", "lo").Run()
	if out, err := exec.CommandContext(ctx, ip, "addr", "add", NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s/32 dev lo: %w: %s", NodeIP, err, strings.TrimSpace(string(out)))
	}
	c.nodeIPAdded = true
	return nil
}

func (c *Cluster) removeNodeIP() error {
	if !c.nodeIPAdded {
		return nil
	}
	if out, err := exec.Command("ip", "addr", "del", NodeIP+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr del %s/32 dev lo: %w: %s", NodeIP, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hasCapSysResource reports whether this process may lower oom_score_adj.
func hasCapSysResource() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			v, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			return err == nil && v&(1<<24) != 0 // CAP_SYS_RESOURCE = 24
		}
	}
	return false
}

// runcBinary is the runc containerd runs: runc itself, or where this
// environment lacks CAP_SYS_RESOURCE, runc behind runc-oom-clamp (see
// test/cmd/runc-oom-clamp), recorded in Limitations.
func (c *Cluster) runcBinary(ctx context.Context) (string, error) {
	runc, err := lookPath("runc", "runc")
	if err != nil {
		return "", err
	}
	if hasCapSysResource() {
		return runc, nil
	}
	out := filepath.Join(c.Dir, "bin", "runc-oom-clamp")
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-X main.runcPath="+runc, "-o", out, "./cmd/runc-oom-clamp")
	cmd.Dir = filepath.Join(repoRoot(), "test")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build runc-oom-clamp: %w: %s", err, b)
	}
	c.note("no CAP_SYS_RESOURCE here: runc cannot set negative oom_score_adj (pod sandboxes get -998), so runc runs behind runc-oom-clamp, which raises negative values to 0")
	return out, nil
}

// startContainerd runs containerd with its own root, state, socket and CNI
// configuration inside the cluster directory.
func (c *Cluster) startContainerd(ctx context.Context) error {
	// containerd loads every spec in CDIDir: a crashed run's claim specs
	// go first.
	c.noteCDIDir()
	if err := c.removeCDISpecs(); err != nil {
		return err
	}
	dir := filepath.Join(c.Dir, "containerd")
	cniDir := filepath.Join(dir, "cni")
	for _, d := range []string{dir, cniDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	// containerd reports NetworkReady once one CNI network config loads.
	// Test pods use hostNetwork, so the bridge is never used by them; it
	// is a real config so a pod without hostNetwork would still work.
	cni := `{
  "cniVersion": "0.4.0",
  "name": "e2e",
  "plugins": [
    {"type": "bridge", "bridge": "gna-e2e0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.77.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}`
	if err := os.WriteFile(filepath.Join(cniDir, "10-e2e.conflist"), []byte(cni), 0o644); err != nil {
		return fmt.Errorf("write cni config: %w", err)
	}
	c.ContainerdSocket = filepath.Join(dir, "containerd.sock")
	runc, err := c.runcBinary(ctx)
	if err != nil {
		return err
	}
	cniBin := "/usr/lib/cni"
	if _, err := os.Stat(filepath.Join(cniBin, "bridge")); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 == nil {
			cniBin = "/opt/cni/bin"
		}
	}
	// Configuration version 3 (containerd 2.x): the CRI plugin is split
	// into io.containerd.cri.v1.images (snapshotter, sandbox image) and
	// io.containerd.cri.v1.runtime (runtimes, CNI, CDI). CDI is on, as by
	// default in 2.x, reading the host's spec directories, so an agent
	// answering Allocate with CDI device names (device-list-strategy
	// cdi-cri) gets them resolved as on a real node.
	config := fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = %q
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = %q
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.ContainerdSocket, filepath.Join(dir, "opt"),
		PauseImage, filepath.Join(c.bins.containerdDir, "containerd-shim-runc-v2"), runc, cniBin, cniDir)
	configPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	p, err := startProcess("containerd", c.LogDir, c.bins.containerd, "--config", configPath, "--log-level", "warn")
	if err != nil {
		return err
	}
	c.containerd = p
	return waitFor(ctx, "containerd", p, func(ctx context.Context) error {
		_, err := c.ctrCommand(ctx, "version")
		return err
	})
}

// stopContainerd kills every container it runs, stops it, and ends the
// shims it started (they outlive containerd by design).
func (c *Cluster) stopContainerd() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	if out, err := c.ctrCommand(ctx, "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out) {
			_, _ = c.ctrCommand(ctx, "tasks", "kill", "--all", "--signal", "SIGKILL", id)
		}
		for _, id := range strings.Fields(out) {
			for i := 0; i < 20; i++ {
				if _, err := c.ctrCommand(ctx, "tasks", "delete", "--force", id); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	errs = append(errs, c.containerd.stop(15*time.Second))
	errs = append(errs, killShims(c.ContainerdSocket))
	return errors.Join(errs...)
}

// killShims kills containerd-shim processes started for the containerd
// listening on socket (their command line names it with -address).
func killShims(socket string) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || !strings.Contains(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == socket {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return nil
}

// kubeletConfig is the KubeletConfiguration the node runs with.
func (c *Cluster) kubeletConfig(port, healthzPort int) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %s
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
registerNode: true
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
fileCheckFrequency: 10s
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
protectKernelDefaults: false
rotateCertificates: false
serverTLSBootstrap: false
`, NodeIP, port, healthzPort, c.pki.CAFile, c.ContainerdSocket, filepath.Join(c.Dir, "pod-logs"))
}

// StartKubelet starts the kubelet (again, after StopKubelet) and waits
// until the node is Ready.
func (c *Cluster) StartKubelet(ctx context.Context) error {
	if c.kubeletArgs == nil {
		port, err := freeport.Get()
		if err != nil {
			return err
		}
		healthz, err := freeport.Get()
		if err != nil {
			return err
		}
		dir := filepath.Join(c.Dir, "kubelet")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create kubelet dir: %w", err)
		}
		cfgPath := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(cfgPath, []byte(c.kubeletConfig(port, healthz)), 0o644); err != nil {
			return fmt.Errorf("write kubelet config: %w", err)
		}
		kubeconfig := filepath.Join(dir, "kubeconfig")
		if err := writeKubeconfig(kubeconfig, c.APIServerURL, c.pki.CAFile, c.pki.KubeletCert, c.pki.KubeletKey); err != nil {
			return err
		}
		args := []string{
			"--config", cfgPath,
			"--kubeconfig", kubeconfig,
			"--root-dir", KubeletRootDir,
			"--cert-dir", filepath.Join(dir, "pki"),
			"--hostname-override", c.NodeName,
			"--node-ip", NodeIP,
			"--v", "2",
		}
		if len(c.opts.NodeLabels) > 0 {
			var labels []string
			for k, v := range c.opts.NodeLabels {
				labels = append(labels, k+"="+v)
			}
			sort.Strings(labels)
			args = append(args, "--node-labels", strings.Join(labels, ","))
		}
		c.kubeletArgs = args
		c.kubeletHealthz = fmt.Sprintf("http://127.0.0.1:%d/healthz", healthz)
	}
	p, err := startProcess("kubelet", c.LogDir, c.bins.path("kubelet"), c.kubeletArgs...)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.kubelet = p
	c.mu.Unlock()
	if err := waitFor(ctx, "kubelet /healthz", p, httpOK(c.kubeletHealthz)); err != nil {
		return err
	}
	return waitFor(ctx, "node "+c.NodeName+" Ready", p, func(ctx context.Context) error {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue && cond.LastHeartbeatTime.After(p.started) {
					return nil
				}
				return fmt.Errorf("node Ready=%s: %s", cond.Status, cond.Message)
			}
		}
		return errors.New("node has no Ready condition yet")
	})
}

// StopKubelet stops the kubelet; pods keep running in containerd, as on a
// real node whose kubelet restarts.
func (c *Cluster) StopKubelet() error {
	c.mu.Lock()
	p := c.kubelet
	c.mu.Unlock()
	return p.stop(20 * time.Second)
}

// RestartKubelet stops and starts the kubelet and waits for the node to
// be Ready again.
func (c *Cluster) RestartKubelet(ctx context.Context) error {
	if err := c.StopKubelet(); err != nil {
		return err
	}
	return c.StartKubelet(ctx)
}

// cleanupNode removes what the kubelet and the agent left on the host:
// mounts and state under /var/lib/kubelet (device-plugins, plugins and
// plugins_registry with it), the agent's CDI specs and the pod cgroups.
func (c *Cluster) cleanupNode() error {
	var errs []error
	errs = append(errs, unmountUnder(KubeletRootDir))
	if err := os.RemoveAll(KubeletRootDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", KubeletRootDir, err))
	}
	errs = append(errs, c.removeCDISpecs())
	if c.ownDir {
		errs = append(errs, unmountUnder(c.Dir))
	}
	removeCgroups("kubepods")
	return errors.Join(errs...)
}

// removeCgroups removes the (by now empty) cgroup trees named name under
// every cgroup v1 controller and the v2 root, deepest first; best effort.
func removeCgroups(name string) {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/" + name)
	if st, err := os.Stat("/sys/fs/cgroup/" + name); err == nil && st.IsDir() {
		roots = append(roots, "/sys/fs/cgroup/"+name)
	}
	for _, root := range roots {
		var dirs []string
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(dirs[i])
		}
	}
}

// AgentCDISpecs lists the agent's spec files in CDIDir (file names).
func AgentCDISpecs() ([]string, error) {
	entries, err := os.ReadDir(CDIDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", CDIDir, err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), cdiVendorPrefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// noteCDIDir records whether CDIDir existed before the cluster started,
// so removeCDISpecs leaves a directory someone else made.
func (c *Cluster) noteCDIDir() {
	_, err := os.Stat(CDIDir)
	c.cdiDirExisted = err == nil
}

// removeCDISpecs removes the agent's spec files from CDIDir (another
// vendor's are left alone) and the directory itself when the cluster's
// run created it (the agent's hostPath is DirectoryOrCreate) and it is
// empty.
func (c *Cluster) removeCDISpecs() error {
	names, err := AgentCDISpecs()
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if err := os.Remove(filepath.Join(CDIDir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cdi spec: %w", err))
		}
	}
	if !c.cdiDirExisted {
		if entries, err := os.ReadDir(CDIDir); err == nil && len(entries) == 0 {
			if err := os.Remove(CDIDir); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", CDIDir, err))
			}
		}
	}
	return errors.Join(errs...)
}

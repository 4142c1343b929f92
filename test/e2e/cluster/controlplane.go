package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

const (
	serviceCIDR  = "10.0.0.0/24"
	serviceAPIIP = "10.0.0.1"
)

// startEtcd runs Debian's etcd on two free loopback ports, data in dir.
func (c *Cluster) startEtcd(ctx context.Context) error {
	client, err := freeport.Get()
	if err != nil {
		return err
	}
	peer, err := freeport.Get()
	if err != nil {
		return err
	}
	clientURL := "http://127.0.0.1:" + strconv.Itoa(client)
	peerURL := "http://127.0.0.1:" + strconv.Itoa(peer)
	p, err := startProcess("etcd", c.LogDir, c.bins.etcd,
		"--name", "e2e",
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", clientURL,
		"--advertise-client-urls", clientURL,
		"--listen-peer-urls", peerURL,
		"--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL,
		"--log-level", "warn",
	)
	if err != nil {
		return err
	}
	c.etcd = p
	c.etcdURL = clientURL
	return waitFor(ctx, "etcd health", p, httpOK(clientURL+"/health"))
}

// startAPIServer runs kube-apiserver against etcd with client-certificate
// authentication, Node and RBAC authorization and service-account keys.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	port, err := freeport.Get()
	if err != nil {
		return err
	}
	args := []string{
		"--etcd-servers", c.etcdURL,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--tls-cert-file", c.pki.ServingCert,
		"--tls-private-key-file", c.pki.ServingKey,
		"--client-ca-file", c.pki.CAFile,
		"--service-account-key-file", c.pki.SAPub,
		"--service-account-signing-key-file", c.pki.SAKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", serviceCIDR,
		"--authorization-mode", "Node,RBAC",
		"--kubelet-client-certificate", c.pki.AdminCert,
		"--kubelet-client-key", c.pki.AdminKey,
		"--kubelet-preferred-address-types", "InternalIP",
		"--allow-privileged=true",
		// The kubernetes Service's endpoints cannot be a loopback address;
		// nothing in the cluster uses the Service (no kube-proxy).
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v", "1",
	}
	// Later flags win: the caller's override the defaults above.
	args = append(args, c.opts.APIServerArgs...)
	p, err := startProcess("kube-apiserver", c.LogDir, c.bins.path("kube-apiserver"), args...)
	if err != nil {
		return err
	}
	c.apiserver = p
	c.APIServerURL = "https://127.0.0.1:" + strconv.Itoa(port)
	c.APIServerPort = port
	c.Kubeconfig = filepath.Join(c.Dir, "admin.kubeconfig")
	if err := writeKubeconfig(c.Kubeconfig, c.APIServerURL, c.pki.CAFile, c.pki.AdminCert, c.pki.AdminKey); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	c.RESTConfig = cfg
	c.Client, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create clientset: %w", err)
	}
	return waitFor(ctx, "kube-apiserver /readyz", p, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(cctx)
		return err
	})
}

// startControllerManager runs kube-controller-manager (service accounts,
// DaemonSet, node lifecycle, root CA publisher ...) with the admin identity.
func (c *Cluster) startControllerManager(ctx context.Context) error {
	port, err := freeport.Get()
	if err != nil {
		return err
	}
	p, err := startProcess("kube-controller-manager", c.LogDir, c.bins.path("kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig,
		"--authorization-kubeconfig", c.Kubeconfig,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(c.Dir, "kcm-certs"),
		"--service-account-private-key-file", c.pki.SAKey,
		"--root-ca-file", c.pki.CAFile,
		"--service-cluster-ip-range", serviceCIDR,
		"--leader-elect=false",
		"--v", "1",
	)
	if err != nil {
		return err
	}
	c.controllerManager = p
	return waitFor(ctx, "kube-controller-manager /healthz", p, httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", port)))
}

// startScheduler runs kube-scheduler with the admin identity.
func (c *Cluster) startScheduler(ctx context.Context) error {
	port, err := freeport.Get()
	if err != nil {
		return err
	}
	p, err := startProcess("kube-scheduler", c.LogDir, c.bins.path("kube-scheduler"),
		"--kubeconfig", c.Kubeconfig,
		"--authentication-kubeconfig", c.Kubeconfig,
		"--authorization-kubeconfig", c.Kubeconfig,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(c.Dir, "scheduler-certs"),
		"--leader-elect=false",
		"--v", "1",
	)
	if err != nil {
		return err
	}
	c.scheduler = p
	return waitFor(ctx, "kube-scheduler /healthz", p, httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", port)))
}

// binaries locates the executables the cluster runs.
type binaries struct {
	kubeDir    string
	etcd       string
	containerd string
	ctr        string
	// containerdDir holds containerd, ctr and containerd-shim-runc-v2;
	// the runc runtime names this shim by path (runtime_path), so a shim
	// of another containerd on the host's PATH is never started.
	containerdDir string
}

// Versions the Makefile builds (mk/e2e.mk: KUBE_VERSION,
// CONTAINERD_VERSION); they only choose the default directories, which
// are keyed by version so a version change never reuses old binaries.
const (
	KubeVersion       = "v1.37.2"
	ContainerdVersion = "v2.2.3"
)

// KubeBinDirEnv overrides where kube-apiserver, kube-controller-manager,
// kube-scheduler and kubelet are found (default
// <repo>/.build/kube/<KubeVersion>).
const KubeBinDirEnv = "KUBE_BIN_DIR"

// ContainerdBinDirEnv overrides where containerd, ctr and
// containerd-shim-runc-v2 (containerd 2.x, built from the Go module
// proxy by `make containerd-bins`) are found (default
// <repo>/.build/containerd/<ContainerdVersion>).
const ContainerdBinDirEnv = "CONTAINERD_BIN_DIR"

func (b binaries) path(name string) string { return filepath.Join(b.kubeDir, name) }

func findBinaries(withNode bool) (binaries, error) {
	b := binaries{kubeDir: os.Getenv(KubeBinDirEnv)}
	if b.kubeDir == "" {
		b.kubeDir = filepath.Join(repoRoot(), ".build", "kube", KubeVersion)
	}
	need := []string{"kube-apiserver"}
	if withNode {
		need = append(need, "kube-controller-manager", "kube-scheduler", "kubelet")
	}
	for _, n := range need {
		if _, err := os.Stat(b.path(n)); err != nil {
			return b, fmt.Errorf("kubernetes binary %s: %w (run `make kube-bins`, or set %s)", n, err, KubeBinDirEnv)
		}
	}
	var err error
	if b.etcd, err = lookPath("etcd", "etcd-server"); err != nil {
		return b, err
	}
	if withNode {
		if b.containerdDir = os.Getenv(ContainerdBinDirEnv); b.containerdDir == "" {
			b.containerdDir = filepath.Join(repoRoot(), ".build", "containerd", ContainerdVersion)
		}
		for _, n := range []string{"containerd", "ctr", "containerd-shim-runc-v2"} {
			if _, err := os.Stat(filepath.Join(b.containerdDir, n)); err != nil {
				return b, fmt.Errorf("containerd binary %s: %w (run `make containerd-bins`, or set %s)", n, err, ContainerdBinDirEnv)
			}
		}
		b.containerd = filepath.Join(b.containerdDir, "containerd")
		b.ctr = filepath.Join(b.containerdDir, "ctr")
		if _, err = lookPath("runc", "runc"); err != nil {
			return b, err
		}
	}
	return b, nil
}

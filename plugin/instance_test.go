package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/testutil"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestTwoInstancesOneDirectory is the node during a rolling update with
// surge: two agents serve the same resource from one directory, each on
// its own socket, and the one that stops removes only its own.
func TestTwoInstancesOneDirectory(t *testing.T) {
	e := newTestEnv(t, Options{Instance: "0ld"})
	const name = "nvidia.com/gpu"
	e.m.Sync([]Resource{&fakeResource{name: name, devs: gpus(2)}})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; r.Endpoint != socketName(name, "0ld") {
		t.Fatalf("old agent registered endpoint %q, want %q", r.Endpoint, socketName(name, "0ld"))
	}

	second, err := NewManager(Options{Dir: e.dir, Instance: "new", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- second.Run(ctx) }()
	defer func() { cancel(); <-done }()
	second.Sync([]Resource{&fakeResource{name: name, devs: gpus(2)}})
	if r := e.kubelet.waitRegistrations(t, 1)[0]; r.Endpoint != socketName(name, "new") {
		t.Fatalf("new agent registered endpoint %q, want %q", r.Endpoint, socketName(name, "new"))
	}

	// The old agent's start-up cleanup and its shutdown leave the new
	// agent's socket alone.
	e.stop()
	if _, err := os.Stat(filepath.Join(e.dir, socketName(name, "0ld"))); !os.IsNotExist(err) {
		t.Errorf("old agent's socket after it stopped: %v, want it removed", err)
	}
	c := dialPlugin(filepath.Join(e.dir, socketName(name, "new")))
	defer c.Close()
	if _, err := pluginapi.NewDevicePluginClient(c).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}); err != nil {
		t.Errorf("new agent's socket after the old agent stopped: %v", err)
	}
}

// TestStaleSocketsRemoved: at start the manager removes sockets of ours
// that nothing listens on (an agent killed before its cleanup), and keeps
// a live one of ours, a dead one too new to be stale (its server may be
// about to listen), other plugins' sockets and anything not a socket.
func TestStaleSocketsRemoved(t *testing.T) {
	dir := testutil.ShortTempDir(t)
	deadSocket := func(name string, age time.Duration) {
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, name), Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		then := time.Now().Add(-age)
		if err := os.Chtimes(filepath.Join(dir, name), then, then); err != nil {
			t.Fatal(err)
		}
	}
	deadSocket("gpu-node-agent-nvidia.com-gpu-dead0001.sock", 2*staleAge)
	deadSocket("gpu-node-agent-nvidia.com-gpu-new00001.sock", 0)
	deadSocket("other-vendor.sock", 2*staleAge)
	live, err := net.Listen("unix", filepath.Join(dir, "gpu-node-agent-nvidia.com-gpu-live0001.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if err := os.WriteFile(filepath.Join(dir, "gpu-node-agent-file.sock"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	m, err := NewManager(Options{Dir: dir, Instance: "abc", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the dead socket of ours removed", func() bool {
		_, err := os.Lstat(filepath.Join(dir, "gpu-node-agent-nvidia.com-gpu-dead0001.sock"))
		return os.IsNotExist(err)
	})
	for _, keep := range []string{"other-vendor.sock", "gpu-node-agent-nvidia.com-gpu-live0001.sock", "gpu-node-agent-nvidia.com-gpu-new00001.sock", "gpu-node-agent-file.sock"} {
		if _, err := os.Lstat(filepath.Join(dir, keep)); err != nil {
			t.Errorf("%s: %v, want it kept", keep, err)
		}
	}
}

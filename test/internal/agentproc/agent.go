// Package agentproc starts the built gpu-node-agent binary for tests, sends
// its output to the test log and stops it when the test ends; it also talks
// to the simulator's control endpoint.
package agentproc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/freeport"
)

// BinaryEnv overrides the path of the agent binary.
const BinaryEnv = "GPU_NODE_AGENT_BIN"

// RepoRoot returns the repository root (the parent of the test module).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	// file is <root>/test/internal/agentproc/agent.go
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// Binary returns the agent binary path ($GPU_NODE_AGENT_BIN or
// <repo>/bin/gpu-node-agent-sim, the agent built with the simulator that
// the tests run in simulate mode) and fails the test when it does not
// exist: `make build-sim` (or `make e2e`) builds it.
func Binary(t testing.TB) string {
	t.Helper()
	p := os.Getenv(BinaryEnv)
	if p == "" {
		p = filepath.Join(RepoRoot(), "bin", "gpu-node-agent-sim")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("agent binary: %v (run `make build-sim` first, or set %s)", err, BinaryEnv)
	}
	return p
}

// FreePort returns a loopback TCP port that was free a moment ago and
// that this process has not handed out before (freeport.Get).
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freeport.Get()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// Agent is a running agent process.
type Agent struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	out  *lineLog
}

// Start runs the agent binary with args; the process is stopped (SIGTERM,
// then SIGKILL after 10 s) when the test ends.
func Start(t testing.TB, args ...string) *Agent {
	t.Helper()
	bin := Binary(t)
	cmd := exec.Command(bin, args...)
	out := &lineLog{t: t, prefix: "agent: "}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	a := &Agent{cmd: cmd, done: make(chan struct{}), out: out}
	go func() {
		a.err = cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(func() {
		if err := a.Stop(10 * time.Second); err != nil {
			t.Logf("stop agent: %v", err)
		}
		out.close()
	})
	t.Logf("started %s %s (pid %d)", bin, strings.Join(args, " "), cmd.Process.Pid)
	return a
}

// Exited is closed when the process has exited.
func (a *Agent) Exited() <-chan struct{} { return a.done }

// Err is the exit error; valid once Exited is closed.
func (a *Agent) Err() error { return a.err }

// Output returns everything the agent printed so far.
func (a *Agent) Output() string { return a.out.String() }

// Stop sends SIGTERM and waits up to grace before killing the process.
func (a *Agent) Stop(grace time.Duration) error {
	select {
	case <-a.done:
		return nil
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
		return nil
	case <-time.After(grace):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
		return fmt.Errorf("agent did not exit within %s of SIGTERM; killed", grace)
	}
}

// lineLog forwards process output to t.Log line by line and keeps a copy.
type lineLog struct {
	t      testing.TB
	prefix string
	mu     sync.Mutex
	buf    bytes.Buffer
	all    bytes.Buffer
	closed bool
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(p)
	if l.closed {
		return len(p), nil
	}
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err == io.EOF {
			l.buf.WriteString(line)
			break
		}
		l.t.Log(l.prefix + strings.TrimRight(line, "\n"))
	}
	return len(p), nil
}

func (l *lineLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// SimControl is a client of the simulator's control endpoint
// (--sim-control-address).
type SimControl struct {
	// Base is "http://host:port".
	Base   string
	Client *http.Client
}

// MIGRequest is the body of POST /mig: the new MIG layout of one GPU
// (an empty Profiles list disables MIG on it).
type MIGRequest struct {
	GPU      int      `json:"gpu"`
	Profiles []string `json:"profiles"`
	// MIGMode true with no profiles puts the GPU in MIG mode with no MIG
	// device.
	MIGMode *bool `json:"migMode,omitempty"`
}

// SetMIG applies a MIG layout to one GPU while the agent runs.
func (c SimControl) SetMIG(ctx context.Context, gpu int, profiles []string) error {
	return c.post(ctx, "/mig", MIGRequest{GPU: gpu, Profiles: profiles})
}

// EnableMIG puts one GPU in MIG mode with no MIG device while the agent
// runs (an operator's nvidia-smi -mig 1).
func (c SimControl) EnableMIG(ctx context.Context, gpu int) error {
	on := true
	return c.post(ctx, "/mig", MIGRequest{GPU: gpu, Profiles: []string{}, MIGMode: &on})
}

// Fault is a fault for POST/DELETE /faults (the simulator's sim.Fault):
// Kind is e.g. "xid", "gpu-lost", "nvlink-down"; which other fields matter
// depends on it.
type Fault struct {
	Kind string `json:"kind"`
	GPU  int    `json:"gpu"`
	XID  uint64 `json:"xid,omitempty"`
	Link int    `json:"link,omitempty"`
	NIC  string `json:"nic,omitempty"`
	MIG  string `json:"mig,omitempty"`
}

// InjectFault injects a fault into the running simulated node.
func (c SimControl) InjectFault(ctx context.Context, f Fault) error {
	return c.send(ctx, http.MethodPost, "/faults", f)
}

// ClearFault clears a fault injected before.
func (c SimControl) ClearFault(ctx context.Context, f Fault) error {
	return c.send(ctx, http.MethodDelete, "/faults", f)
}

// Post sends body as JSON to path and fails on a non-2xx answer; for the
// control endpoints other tests use.
func (c SimControl) Post(ctx context.Context, path string, body any) error {
	return c.post(ctx, path, body)
}

func (c SimControl) post(ctx context.Context, path string, body any) error {
	return c.send(ctx, http.MethodPost, path, body)
}

func (c SimControl) send(ctx context.Context, method, path string, body any) error {
	return c.do(ctx, method, path, body, nil)
}

// do sends body (none when nil) as JSON and decodes a 2xx answer into out
// (when not nil).
func (c SimControl) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return fmt.Errorf("build %s request: %w", path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(msg)))
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// Process is the body of POST /processes (the simulator's
// sim.ProcessSpec): a simulated process holding memory on a GPU (or one of
// its MIG devices), of a pod (Kind "pod": PodUID, ContainerID) or of the
// host (Kind "host").
type Process struct {
	GPU         int    `json:"gpu"`
	MIG         string `json:"mig,omitempty"`
	MemoryMiB   uint64 `json:"memoryMiB"`
	Kind        string `json:"kind"`
	PodUID      string `json:"podUID,omitempty"`
	ContainerID string `json:"containerID,omitempty"`
	IgnoreTerm  bool   `json:"ignoreTerm,omitempty"`
	// Uninterruptible is a process in state D: no signal ends it.
	Uninterruptible bool `json:"uninterruptible,omitempty"`
	// SMUtil and MemUtil are what the process keeps busy (percent), as
	// NVML's per-process utilisation reports it on a whole GPU.
	SMUtil  uint32 `json:"smUtil,omitempty"`
	MemUtil uint32 `json:"memUtil,omitempty"`
}

// StartProcess starts a simulated GPU process and returns its PID.
func (c SimControl) StartProcess(ctx context.Context, p Process) (uint32, error) {
	var out struct {
		PID uint32 `json:"pid"`
	}
	if err := c.do(ctx, http.MethodPost, "/processes", p, &out); err != nil {
		return 0, err
	}
	if out.PID == 0 {
		return 0, fmt.Errorf("POST /processes: no pid in the answer")
	}
	return out.PID, nil
}

// StopProcess ends a simulated process as a normal exit would.
func (c SimControl) StopProcess(ctx context.Context, pid uint32) error {
	return c.send(ctx, http.MethodDelete, "/processes/"+strconv.FormatUint(uint64(pid), 10), nil)
}

// ProcessPIDs returns the PIDs of the simulated processes still running.
func (c SimControl) ProcessPIDs(ctx context.Context) ([]uint32, error) {
	var out []struct {
		PID uint32 `json:"pid"`
	}
	if err := c.do(ctx, http.MethodGet, "/processes", nil, &out); err != nil {
		return nil, err
	}
	pids := make([]uint32, 0, len(out))
	for _, p := range out {
		pids = append(pids, p.PID)
	}
	return pids, nil
}

// CopyBinary copies an agent binary as cp does (copy_file_range, through io.Copy): how the
// file is written decides the size of its page-cache folios, and so how
// many pages one fault maps (one whole write makes larger ones), so a
// copy made here is resident as one an image unpacks or cp makes.
func CopyBinary(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

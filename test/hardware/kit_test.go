// Package hardware checks the shape of a capture of the hardware check kit
// (hw-check.sh, README.md): the files it writes, what the fake kubelet saw
// and what the agent served, on a simulated node here or a real one.
package hardware

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
)

// CaptureEnv names a capture directory to check instead of running the
// kit.
const CaptureEnv = "GNA_HW_CAPTURE"

// simProfile is the node the kit runs on when the test runs it; the
// dgx-h100 profile has 8 GPUs and no MIG, so mig-strategy none serves 8
// nvidia.com/gpu.
const (
	simProfile = "dgx-h100"
	simGPUs    = 8
	gpuRes     = "nvidia.com/gpu"
)

// capture returns the capture to check: $GNA_HW_CAPTURE, or one the test
// makes by running the built kit (make hw-kit) on a simulated node.
func capture(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv(CaptureEnv); dir != "" {
		return dir
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	kit := filepath.Join(root, ".build", "hwkit")
	simBin := filepath.Join(root, ".build", "hwkit-bin", "gpu-node-agent-sim")
	simSMI := filepath.Join(root, ".build", "hwkit-bin", "simsmi")
	for _, p := range []string{filepath.Join(kit, "hw-check.sh"), simBin} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("no built kit (%s): run `make hw-kit`, or set %s to a capture", p, CaptureEnv)
		}
	}
	if testing.Short() {
		t.Skip("-short: running the kit takes about a minute")
	}
	out := filepath.Join(t.TempDir(), "capture")
	args := []string{filepath.Join(kit, "hw-check.sh"), "--kit", kit, "--out", out,
		"--simulate", simProfile, "--sim-bin", simBin, "--agent-seconds", "20"}
	if _, err := os.Stat(simSMI); err == nil {
		args = append(args, "--sim-smi", simSMI)
	}
	cmd := exec.Command("bash", args...)
	b, err := cmd.CombinedOutput()
	t.Logf("hw-check.sh: %s", b)
	if err != nil {
		t.Fatalf("hw-check.sh: %v", err)
	}
	return out
}

// kubeletReport is the part of hwkubelet's report the test reads.
type kubeletReport struct {
	Exercised     bool   `json:"exercised"`
	Error         string `json:"error"`
	Registrations []struct {
		ResourceName string `json:"resourceName"`
		Error        string `json:"error"`
	} `json:"registrations"`
	Resources map[string]struct {
		Connected bool `json:"connected"`
		Devices   []struct {
			ID        string  `json:"id"`
			Health    string  `json:"health"`
			NUMANodes []int64 `json:"numaNodes"`
		} `json:"devices"`
		Preferred []struct {
			Size      int      `json:"size"`
			DeviceIDs []string `json:"deviceIDs"`
			Error     string   `json:"error"`
		} `json:"preferred"`
		Allocate []struct {
			DeviceIDs []string `json:"deviceIDs"`
			Error     string   `json:"error"`
			Response  *struct {
				Envs        map[string]string `json:"envs"`
				Annotations map[string]string `json:"annotations"`
				Mounts      []struct {
					ContainerPath string `json:"containerPath"`
				} `json:"mounts"`
				Devices []struct {
					ContainerPath string `json:"containerPath"`
				} `json:"devices"`
				CDIDevices []string `json:"cdiDevices"`
			} `json:"response"`
		} `json:"allocate"`
	} `json:"resources"`
}

func readKubelet(t *testing.T, path string) kubeletReport {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("fake kubelet report: %v", err)
	}
	var r kubeletReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("fake kubelet report %s: %v", path, err)
	}
	return r
}

// kitInfo is what kit.txt says about the run.
type kitInfo struct {
	simulate string
	// simSMI: simsmi stood in for nvidia-smi (--sim-smi).
	simSMI   bool
	totalSec float64
	budget   int
}

var totalRE = regexp.MustCompile(`^total ([0-9.]+)s of a ([0-9]+)s budget`)

func readKit(t *testing.T, dir string) kitInfo {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "kit.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var k kitInfo
	sawTotal := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "mode: simulate "); ok {
			k.simulate = p
		}
		if strings.HasPrefix(line, "nvidia-smi: simsmi ") {
			k.simSMI = true
		}
		if m := totalRE.FindStringSubmatch(line); m != nil {
			k.totalSec, _ = strconv.ParseFloat(m[1], 64)
			k.budget, _ = strconv.Atoi(m[2])
			sawTotal = true
		}
	}
	if !sawTotal {
		t.Fatal("kit.txt has no total line: the kit did not finish")
	}
	return k
}

// unavailable reads unavailable.txt: thing -> why.
func unavailable(t *testing.T, dir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "unavailable.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		thing, why, ok := strings.Cut(line, ": ")
		if !ok || why == "" {
			t.Errorf("unavailable.txt: line %q is not THING: WHY", line)
		}
		out[thing] = why
	}
	return out
}

// topologyGPUs counts the GPUs of the agent's topology dump.
func topologyGPUs(t *testing.T, dir string, missing map[string]string) int {
	t.Helper()
	if why, ok := missing["agent/topology.json"]; ok {
		t.Skipf("no topology dump to learn the node's GPUs from: %s", why)
	}
	b, err := os.ReadFile(filepath.Join(dir, "agent", "topology.json"))
	if err != nil {
		t.Skipf("no topology dump to learn the node's GPUs from: %v", err)
	}
	var snap struct {
		GPUs []json.RawMessage `json:"gpus"`
	}
	if err := json.Unmarshal(b, &snap); err != nil {
		t.Fatalf("agent/topology.json: %v", err)
	}
	return len(snap.GPUs)
}

func TestCapture(t *testing.T) {
	dir := capture(t)
	kit := readKit(t, dir)
	missing := unavailable(t, dir)

	t.Run("files", func(t *testing.T) {
		// Always written, whatever the machine.
		for _, f := range []string{
			"kit.txt", "kit-versions.txt", "agent/agent-config.yaml",
			"references/uname-a.txt", "references/glibc-ldd-version.txt", "references/cpuinfo-head.txt",
			"references/nproc.txt", "references/sandbox.txt",
		} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		// Written, or named in unavailable.txt with the reason.
		for _, f := range []string{
			"references/nvidia-smi-q.xml", "references/nvidia-smi-q.txt", "references/nvidia-smi-topo-m.txt",
			"references/nvidia-smi-nvlink-s.txt", "references/nvidia-smi-L.txt",
			"references/proc-driver-nvidia-version.txt", "references/dev-nvidia-ls.txt", "references/pci-nvidia.txt",
			"agent/version.txt", "agent/topology.json", "agent/preflight.txt", "agent/census.json",
			"run/kubelet.json", "run/agent.log", "run/metrics-1.txt", "run/metrics-2.txt", "run/resources.tsv",
		} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				if _, ok := missing[f]; !ok {
					t.Errorf("%s is neither captured nor in unavailable.txt", f)
				}
			}
		}
	})

	// On a simulated node with simsmi (make hw-check-sim), nvidia-smi's
	// XML and GPU list are captured and the rest is recorded as not
	// simulated; without it nvidia-smi is missing, as on any machine
	// without a driver, and "files" checks that it says so.
	t.Run("nvidia-smi", func(t *testing.T) {
		if !kit.simSMI {
			t.Skip("nvidia-smi was not simulated (no --sim-smi)")
		}
		for _, f := range []string{"references/nvidia-smi-q.xml", "references/nvidia-smi-L.txt"} {
			if why, ok := missing[f]; ok {
				t.Errorf("%s: unavailable on a simulated node with simsmi: %s", f, why)
			}
		}
		for _, f := range []string{"references/nvidia-smi-q.txt", "references/nvidia-smi-topo-m.txt", "references/nvidia-smi-nvlink-s.txt"} {
			if why := missing[f]; !strings.Contains(why, "not simulated") {
				t.Errorf("%s: unavailable.txt says %q, want simsmi's \"not simulated\"", f, why)
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, "references", "nvidia-smi-q.xml"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := nvsmi.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if kit.simulate == simProfile && len(l.GPUs) != simGPUs {
			t.Errorf("nvidia-smi-q.xml lists %d GPUs, want %d", len(l.GPUs), simGPUs)
		}
	})

	// The script keeps its own budget (each step bounded, steps skipped
	// once it is spent); the time taken is logged, not asserted.
	t.Run("budget", func(t *testing.T) {
		if kit.budget > 300 {
			t.Errorf("kit.txt: a %ds budget; the kit must be set to finish within 300s", kit.budget)
		}
		t.Logf("the kit took %.1fs of its %ds budget", kit.totalSec, kit.budget)
	})

	// The GPUs the agent should serve: the profile's when simulated, the
	// topology dump's on a real node.
	want := simGPUs
	if kit.simulate == "" {
		want = topologyGPUs(t, dir, missing)
	} else if kit.simulate != simProfile {
		t.Skipf("kit.txt: simulated %q; the checks below know %s", kit.simulate, simProfile)
	}
	if want == 0 {
		t.Skip("no GPU on this node: nothing served to check")
	}

	t.Run("kubelet", func(t *testing.T) {
		r := readKubelet(t, filepath.Join(dir, "run", "kubelet.json"))
		if !r.Exercised {
			t.Fatalf("run/kubelet.json: not exercised: %s", r.Error)
		}
		checkGPUs(t, r, want, kit.simulate != "")
		res := r.Resources[gpuRes]
		if !res.Connected {
			t.Errorf("%s was no longer connected at the end of the run", gpuRes)
		}
		if len(res.Preferred) != min(2, want) {
			t.Errorf("%d GetPreferredAllocation calls, want %d", len(res.Preferred), min(2, want))
		}
		for _, p := range res.Preferred {
			if p.Error != "" || len(p.DeviceIDs) != p.Size {
				t.Errorf("GetPreferredAllocation of %d: got %v, error %q", p.Size, p.DeviceIDs, p.Error)
			}
		}
	})

	t.Run("strategies", func(t *testing.T) {
		for _, s := range []string{"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"} {
			for _, specs := range []bool{false, true} {
				name := s
				if specs {
					name += "-specs"
				}
				t.Run(name, func(t *testing.T) {
					path := "run/strategies/" + name
					if why, ok := missing[path]; ok {
						if s != "cdi-annotations" {
							t.Fatalf("%s: %s", path, why)
						}
						t.Skipf("%s: %s", path, why)
					}
					r := readKubelet(t, filepath.Join(dir, path+".json"))
					checkGPUs(t, r, want, kit.simulate != "")
					checkAllocate(t, r, s, specs)
				})
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(dir, "run", "metrics-2.txt"))
		if err != nil {
			t.Fatal(err)
		}
		gpus := map[string]bool{}
		re := regexp.MustCompile(`[{,]UUID="([^"]+)"`)
		for _, line := range strings.Split(string(b), "\n") {
			if !strings.HasPrefix(line, "DCGM_FI_DEV_GPU_TEMP{") {
				continue
			}
			if m := re.FindStringSubmatch(line); m != nil {
				gpus[m[1]] = true
			}
		}
		if len(gpus) != want {
			t.Errorf("run/metrics-2.txt: DCGM_FI_DEV_GPU_TEMP for %d GPUs, want %d", len(gpus), want)
		}
	})

	t.Run("readyz", func(t *testing.T) {
		var codes []string
		for _, n := range []string{"1", "2"} {
			b, err := os.ReadFile(filepath.Join(dir, "run", "readyz-"+n+".code"))
			if err != nil {
				t.Fatal(err)
			}
			codes = append(codes, strings.TrimSpace(string(b)))
		}
		if codes[len(codes)-1] != "200" {
			t.Errorf("/readyz answered %v; want 200 at the end of the run", codes)
		}
	})
}

// checkGPUs checks that the fake kubelet saw want healthy GPUs, each with
// a NUMA node when numa is set (a real machine may have none to give),
// and that every Allocate call succeeded.
func checkGPUs(t *testing.T, r kubeletReport, want int, numa bool) {
	t.Helper()
	registered := false
	for _, reg := range r.Registrations {
		if reg.ResourceName == gpuRes && reg.Error == "" {
			registered = true
		}
	}
	if !registered {
		t.Fatalf("%s never registered: %+v", gpuRes, r.Registrations)
	}
	res, ok := r.Resources[gpuRes]
	if !ok {
		t.Fatalf("no %s in the report", gpuRes)
	}
	if len(res.Devices) != want {
		t.Errorf("%s: %d devices, want %d", gpuRes, len(res.Devices), want)
	}
	for _, d := range res.Devices {
		if d.Health != "Healthy" || (numa && len(d.NUMANodes) != 1) {
			t.Errorf("%s: device %s is %s with NUMA nodes %v; want Healthy on one node", gpuRes, d.ID, d.Health, d.NUMANodes)
		}
	}
	if len(res.Allocate) != min(2, want) {
		t.Errorf("%d Allocate calls, want %d", len(res.Allocate), min(2, want))
	}
	for _, a := range res.Allocate {
		if a.Error != "" || a.Response == nil {
			t.Errorf("Allocate %v: %q", a.DeviceIDs, a.Error)
		}
	}
}

// checkAllocate checks that each Allocate response passes its devices the
// way the strategy says, with device nodes only when specs are passed.
func checkAllocate(t *testing.T, r kubeletReport, strategy string, specs bool) {
	t.Helper()
	for _, a := range r.Resources[gpuRes].Allocate {
		if a.Response == nil {
			continue
		}
		resp := a.Response
		for _, id := range a.DeviceIDs {
			var got bool
			switch strategy {
			case "envvar":
				got = strings.Contains(resp.Envs["NVIDIA_VISIBLE_DEVICES"], id)
			case "volume-mounts":
				for _, m := range resp.Mounts {
					got = got || strings.HasSuffix(m.ContainerPath, "/"+id)
				}
			case "cdi-cri", "cdi-annotations":
				for _, c := range resp.CDIDevices {
					got = got || c == gpuRes+"="+id
				}
				for _, v := range resp.Annotations {
					got = got || strings.Contains(v, id)
				}
			}
			if !got {
				t.Errorf("Allocate %v with %s: %s is not passed: %s", a.DeviceIDs, strategy, id, dump(resp))
			}
		}
		if specs != (len(resp.Devices) > 0) {
			t.Errorf("Allocate %v with pass-device-specs=%t: %d device specs", a.DeviceIDs, specs, len(resp.Devices))
		}
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

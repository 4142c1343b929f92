package agent

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/agent/simhw"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/sim"
)

// testConfig is a test agent's configuration: the agent's own and the
// simulated node it runs on (what gpu-node-agent-sim's --simulate,
// --sim-control-address and --nvml-call-timeout set).
type testConfig struct {
	Config
	// Simulate is the sim profile to run on.
	Simulate string
	// SimControlAddress is the simulator control endpoint ("" for none).
	SimControlAddress string
	NVMLCallTimeout   time.Duration
	// BootTime, when set, is the host's boot time: a /proc/stat saying it
	// is written under the simulated host root before the agent opens.
	BootTime time.Time
}

// defaults is the configuration cmd/gpu-node-agent's defaults give.
func defaults() testConfig {
	return testConfig{
		Config: Config{
			Version:         "dev",
			DevicePluginDir: "/var/lib/kubelet/device-plugins",
			GPU:             gpu.Config{MIGStrategy: gpu.MIGStrategyNone, DeviceListStrategy: gpu.DeviceListEnvvar},
			RescanInterval:  30 * time.Second,
			MetricsAddress:  ":9400",
			MetricsInterval: metrics.DefaultInterval,
			PodAttribution:  true,
			NodeLabels:      true,
			MoveAdvice:      true,
			KubeClient:      kubeapi.ClientConfig{}.WithDefaults(),
		},
		SimControlAddress: "127.0.0.1:9402",
		NVMLCallTimeout:   nvmlowner.DefaultCallTimeout,
	}
}

// openAgent opens the agent on a simulated node in a temporary host root.
// Without a state dir, the health state goes under that root, as
// gpu-node-agent-sim's default does.
func openAgent(cfg testConfig, log *slog.Logger, stdout io.Writer) (*Agent, error) {
	model, err := sim.Profile(cfg.Simulate)
	if err != nil {
		return nil, err
	}
	hw, err := simhw.Open(simhw.Options{
		Model:          model,
		Name:           cfg.Simulate,
		NVML:           nvmlowner.Config{CallTimeout: cfg.NVMLCallTimeout},
		ControlAddress: cfg.SimControlAddress,
		Logger:         log,
	})
	if err != nil {
		return nil, err
	}
	if cfg.Health.StateDir == "" {
		cfg.Health.StateDir = filepath.Join(hw.HostRoot(), "var/lib/gpu-node-agent")
	}
	if !cfg.BootTime.IsZero() {
		if err := writeProcStat(hw.HostRoot(), cfg.BootTime); err != nil {
			hw.Close()
			return nil, err
		}
	}
	return Open(cfg.Config, hw, log, stdout)
}

// simOf is the simulated node a test agent runs on.
func simOf(a *Agent) *sim.Node { return a.hw.(*simhw.Hardware).Node() }

// writeProcStat writes root/proc/stat as a 2-CPU host that booted at
// boot has it (proc(5); the counters are a real host's, shortened).
func writeProcStat(root string, boot time.Time) error {
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		return err
	}
	stat := fmt.Sprintf(`cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0
cpu0 1393280 32966 572056 13343292 6130 0 17875 0 0 0
cpu1 1335359 32938 570917 13357311 5769 0 2316 0 0 0
intr 199292460 42 0 0 0 0 0 0 0 1 0 0 0
ctxt 38014093
btime %d
processes 26442
procs_running 1
procs_blocked 0
softirq 5057579 250191 1481983 1647 211099 186066 0 1783454 450370 12 691957
`, boot.Unix())
	return os.WriteFile(filepath.Join(root, "proc", "stat"), []byte(stat), 0o444)
}

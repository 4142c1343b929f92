package agent

import (
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/agent/simhw"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
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
	return Open(cfg.Config, hw, log, stdout)
}

// simOf is the simulated node a test agent runs on.
func simOf(a *Agent) *sim.Node { return a.hw.(*simhw.Hardware).Node() }

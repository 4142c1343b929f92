package main

import (
	"cmp"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/gpu-node-agent/gpu-node-agent/agent"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
)

// envPrefix prefixes every option's environment variable: --mig-strategy is
// GNA_MIG_STRATEGY.
const envPrefix = "GNA_"

// Config is the agent's whole configuration: defaults, then the YAML file
// (--config), then GNA_* environment variables (and NODE_NAME), then flags,
// each overriding the one before. The YAML keys are the flag names.
type Config struct {
	// Config is the YAML file that was read, if any.
	Config string `json:"-"`
	// NVIDIAConfig is a config file of NVIDIA's device plugin (version
	// v1) whose MIG strategy, device-list settings and time-slicing the
	// agent takes (see applyNVIDIAConfig).
	NVIDIAConfig string `json:"nvidia-config,omitempty"`
	// nvidiaIgnored says what NVIDIAConfig sets that changes nothing here;
	// it is logged once the logger exists.
	nvidiaIgnored []string

	Simulate          string `json:"simulate,omitempty"`
	SimControlAddress string `json:"sim-control-address,omitempty"`
	// SimFaults are faults the simulated node has before NVML's first
	// init: KIND[:GPU][=VALUE],...
	SimFaults       string `json:"sim-faults,omitempty"`
	DevicePluginDir string `json:"device-plugin-dir,omitempty"`
	HostRoot        string `json:"host-root,omitempty"`
	// StateDir keeps the health state across restarts (empty disables).
	StateDir           string   `json:"state-dir"`
	MIGStrategy        string   `json:"mig-strategy,omitempty"`
	DeviceListStrategy string   `json:"device-list-strategy,omitempty"`
	PassDeviceSpecs    bool     `json:"pass-device-specs,omitempty"`
	RescanInterval     Duration `json:"rescan-interval,omitempty"`
	// NVMLCallTimeout bounds every NVML call on a GPU (a hung GPU is
	// unhealthy after it and never delays another GPU).
	NVMLCallTimeout Duration `json:"nvml-call-timeout,omitempty"`
	MetricsAddress  string   `json:"metrics-address,omitempty"`
	NodeName        string   `json:"node-name,omitempty"`
	PodUID          string   `json:"pod-uid,omitempty"`
	Kubeconfig      string   `json:"kubeconfig,omitempty"`
	// KubeAPIQPS and KubeAPIBurst are the API client's rate limit.
	KubeAPIQPS   float64 `json:"kube-api-qps,omitempty"`
	KubeAPIBurst int     `json:"kube-api-burst,omitempty"`
	LogFormat    string  `json:"log-format,omitempty"`
	LogLevel     string  `json:"log-level,omitempty"`
	// PrintInventory prints what is served at start and on every change
	// (the demo uses it: there is no kubelet to ask).
	PrintInventory bool `json:"print-inventory,omitempty"`
	// ExitAfter stops the agent after this long (0: run until signalled),
	// for smoke tests and non-interactive demos.
	ExitAfter Duration `json:"exit-after,omitempty"`

	// NodeLabels keeps the agent's topology labels on the Node (needs
	// node-name and API access).
	NodeLabels bool `json:"node-labels"`

	// The sections below are YAML objects whose keys are their packages'
	// own (camelCase) field names; the common fields also have flags.
	Health  HealthSection  `json:"health"`
	Taint   TaintSection   `json:"taint"`
	Metrics MetricsSection `json:"metrics"`
	RDMA    rdma.Config    `json:"rdma"`
	// DRA says which device kinds are served through DRA.
	DRA agent.DRAConfig `json:"dra"`
	// Sharing is how device-plugin resources are shared (time-slicing).
	Sharing SharingSection `json:"sharing"`
	// Preflight is the active checks a node must pass before it takes
	// work (the preflight subcommand runs them once).
	Preflight PreflightSection `json:"preflight"`
	// Remediation is the self-healing steps (GPU reset, drain, reboot
	// request), each off unless enabled.
	Remediation RemediationSection `json:"remediation"`
	// Placement is advice on where pods go: the move advice.
	Placement PlacementSection `json:"placement"`
}

// MetricsSection configures the GPU metrics collector and the endpoint
// (config key `metrics`; the address is the top-level metrics-address).
type MetricsSection struct {
	// Interval between NVML collections (--metrics-interval).
	Interval Duration `json:"interval,omitempty"`
	// DeviceTimeout is deprecated and ignored (kept so existing config
	// files still load): the NVML call timeout is --nvml-call-timeout.
	DeviceTimeout Duration `json:"deviceTimeout,omitempty"`
	// PodAttribution adds pod/namespace/container labels from the
	// kubelet's pod-resources socket under the host root.
	PodAttribution bool `json:"podAttribution"`
	// DCGMNames is legacy (default), both or current: the DCGM field
	// names the DCGM_ series are served under (metrics.DCGMNames).
	DCGMNames string `json:"dcgmNames,omitempty"`
	// WebConfigFile is exporter-toolkit's TLS/basic-auth file
	// (--web.config.file); empty serves plain HTTP.
	WebConfigFile string `json:"webConfigFile,omitempty"`
}

// defaults is the configuration before any file, env or flag.
func defaults() Config {
	return Config{
		SimControlAddress:  defaultSimControlAddress,
		DevicePluginDir:    "/var/lib/kubelet/device-plugins",
		HostRoot:           "/",
		StateDir:           defaultStateDir,
		MIGStrategy:        gpu.MIGStrategyNone,
		DeviceListStrategy: gpu.DeviceListEnvvar,
		RescanInterval:     Duration{30 * time.Second},
		NVMLCallTimeout:    Duration{nvmlowner.DefaultCallTimeout},
		MetricsAddress:     ":9400",
		LogFormat:          "text",
		LogLevel:           "info",
		NodeLabels:         true,
		Placement:          PlacementSection{Placement{MoveAdvice: true}},
		KubeAPIQPS:         kubeapi.ClientConfig{}.WithDefaults().QPS,
		KubeAPIBurst:       kubeapi.ClientConfig{}.WithDefaults().Burst,
		Metrics: MetricsSection{
			Interval: Duration{metrics.DefaultInterval},
			// Deprecated and ignored; kept so that files setting it load.
			DeviceTimeout:  Duration{5 * time.Second},
			PodAttribution: true,
		},
	}
}

// option is one setting, shared by flag, env var and YAML key.
type option struct {
	name  string
	usage string
	bind  func(fs *flag.FlagSet, c *Config, name, usage string)
	// env overrides the GNA_ variable name (NODE_NAME comes from the
	// downward API under that name).
	env string
}

func str(f func(*Config) *string) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.StringVar(f(c), name, *f(c), usage) }
}

func boolean(f func(*Config) *bool) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.BoolVar(f(c), name, *f(c), usage) }
}

func duration(f func(*Config) *Duration) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.Var(f(c), name, usage) }
}

// options lists every setting once; flags, env and help come from it.
var options = []option{
	{name: "simulate", usage: "run on a simulated node: PROFILE[,mig=GPU:PROF+PROF...], a topology snapshot FILE.json, or capture:DIR, the node of a hardware check capture", bind: str(func(c *Config) *string { return &c.Simulate })},
	{name: "sim-control-address", usage: "loopback address of the simulator's control endpoint (simulate only; empty disables)", bind: str(func(c *Config) *string { return &c.SimControlAddress })},
	{name: "sim-faults", usage: "faults the simulated node has from the start, before NVML's first init: KIND[:GPU][=VALUE],..., e.g. nvml-failure, gpu-lost:3, pcie-degraded:3=4x8, throttle:2=hw-slowdown, old-driver=535.54.03, command-fail=3, command-slow=600 (simulate only; the control API clears them)", bind: str(func(c *Config) *string { return &c.SimFaults })},
	{name: "nvidia-config", usage: "config file of NVIDIA's device plugin (version: v1): its flags.migStrategy, flags.plugin.passDeviceSpecs and deviceListStrategy and sharing.timeSlicing are used; settings the agent cannot honour are refused by name", bind: str(func(c *Config) *string { return &c.NVIDIAConfig })},
	{name: "device-plugin-dir", usage: "kubelet device-plugin directory (holds kubelet.sock and our sockets)", bind: str(func(c *Config) *string { return &c.DevicePluginDir })},
	{name: "host-root", usage: "where the host's / is mounted (/dev, /sys, /proc/driver are read under it)", bind: str(func(c *Config) *string { return &c.HostRoot })},
	{name: "state-dir", usage: "directory (on the host) where device health, held faults and counter baselines persist across restarts; empty disables (with --simulate the default moves under the simulated host root)", bind: str(func(c *Config) *string { return &c.StateDir })},
	{name: "mig-strategy", usage: "how MIG devices are served: none, single or mixed", bind: str(func(c *Config) *string { return &c.MIGStrategy })},
	{name: "device-list-strategy", usage: "how Allocate passes devices: envvar, volume-mounts or cdi-cri", bind: str(func(c *Config) *string { return &c.DeviceListStrategy })},
	{name: "pass-device-specs", usage: "also return the /dev nodes each container needs", bind: boolean(func(c *Config) *bool { return &c.PassDeviceSpecs })},
	{name: "rescan-interval", usage: "how often to rediscover devices (0 disables; SIGHUP rescans at once)", bind: duration(func(c *Config) *Duration { return &c.RescanInterval })},
	{name: "nvml-call-timeout", usage: "bound on every NVML call on one GPU; a GPU whose calls hang longer is unhealthy (nvml-timeout)", bind: duration(func(c *Config) *Duration { return &c.NVMLCallTimeout })},
	{name: "metrics-address", usage: "address of the /metrics endpoint (empty disables)", bind: str(func(c *Config) *string { return &c.MetricsAddress })},
	{name: "node-name", env: "NODE_NAME", usage: "this node's Kubernetes name (env NODE_NAME)", bind: str(func(c *Config) *string { return &c.NodeName })},
	{name: "pod-uid", env: "POD_UID", usage: "the agent pod's UID (env POD_UID): the device-plugin sockets carry it and the DRA kubelet plugin serves rolling updates, so an old and a new pod serve the node at once", bind: str(func(c *Config) *string { return &c.PodUID })},
	{name: "kubeconfig", usage: "kubeconfig for the API server (empty: in-cluster)", bind: str(func(c *Config) *string { return &c.Kubeconfig })},
	{name: "kube-api-qps", usage: "sustained rate of requests to the API server (client-side limit)", bind: float(func(c *Config) *float64 { return &c.KubeAPIQPS })},
	{name: "kube-api-burst", usage: "requests to the API server allowed at once above kube-api-qps", bind: integer(func(c *Config) *int { return &c.KubeAPIBurst })},
	{name: "log-format", usage: "log format: text or json", bind: str(func(c *Config) *string { return &c.LogFormat })},
	{name: "log-level", usage: "log level: debug, info, warn or error", bind: str(func(c *Config) *string { return &c.LogLevel })},
	{name: "print-inventory", usage: "print what is served at start and on every change", bind: boolean(func(c *Config) *bool { return &c.PrintInventory })},
	{name: "node-labels", usage: "keep topology labels (gpu count, product, MIG, NVLink) and the NIC↔GPU annotation on the Node (needs node-name)", bind: boolean(func(c *Config) *bool { return &c.NodeLabels })},
	{name: "move-advice", usage: "keep the move advice on the Node (annotation gpu-node-agent.io/move-advice: the fewest pods whose moving elsewhere frees a larger NVLink block, each read from the API server for its priority and owner); advice only, nothing is evicted (needs node-name; config placement.moveAdvice)", bind: boolean(func(c *Config) *bool { return &c.Placement.MoveAdvice })},
	{name: "taint-mode", usage: "taint the Node while it is unfit: off, dry-run or on (needs node-name; config taint.mode)", bind: str(func(c *Config) *string { return &c.Taint.Mode })},
	{name: "taint-lease-namespace", env: "POD_NAMESPACE", usage: "namespace of the fleet safeguard's slot Leases: the agent's own (env POD_NAMESPACE; config taint.leaseNamespace; default \"default\")", bind: str(func(c *Config) *string { return &c.Taint.LeaseNamespace })},
	{name: "recovery-period", usage: "how long every cause of a device fault must stay clear before it is healthy again (config health.recoveryPeriod; default 5m)", bind: stdDuration(func(c *Config) *time.Duration { return &c.Health.RecoveryPeriod })},
	{name: "fatal-xids", usage: "comma-separated XIDs that make a GPU unhealthy (config health.fatalXIDs; default NVIDIA's reset/reboot XIDs)", bind: uintList(func(c *Config) *[]uint64 { return &c.Health.FatalXIDs })},
	{name: "metrics-interval", usage: "how often GPU metrics are read from NVML (config metrics.interval)", bind: duration(func(c *Config) *Duration { return &c.Metrics.Interval })},
	{name: "web.config.file", usage: "exporter-toolkit web config (TLS, basic auth) for the metrics endpoint (config metrics.webConfigFile)", bind: str(func(c *Config) *string { return &c.Metrics.WebConfigFile })},
	{name: "preflight-expected-gpus", usage: "how many GPUs the node must have, on the PCI bus and in NVML, for the preflight's gpu-count item (config preflight.gpuCount.expected; 0: as many as the bus shows)", bind: integer(func(c *Config) *int { return &c.Preflight.GPUCount.Expected })},
	{name: "exit-after", usage: "exit cleanly after this long (0: run until SIGINT/SIGTERM)", bind: duration(func(c *Config) *Duration { return &c.ExitAfter })},
}

func (o option) envName() string {
	if o.env != "" {
		return o.env
	}
	return envPrefix + strings.Map(envRune, o.name)
}

// envRune is a flag name's rune in its environment variable: upper case,
// and "_" for "-" and ".".
func envRune(r rune) rune {
	if r == '-' || r == '.' {
		return '_'
	}
	return unicode.ToUpper(r)
}

// flagSet binds every option, plus --config, to c.
func flagSet(c *Config, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gpu-node-agent", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Config, "config", c.Config, "YAML config file; keys are the flag names (env GNA_CONFIG)")
	for _, o := range options {
		o.bind(fs, c, o.name, o.usage+" (env "+o.envName()+")")
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: gpu-node-agent [flags]\n       gpu-node-agent demo [flags]\n       gpu-node-agent preflight [flags]\n       gpu-node-agent version\n       gpu-node-agent topology dump|preferred [flags]\n       gpu-node-agent nvml census [flags]\n\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// loadConfig builds the Config from defaults < file < NVIDIA's file <
// env < flags (NVIDIA's file may not contradict the agent's: see
// applyNVIDIAConfig). It does not validate; call Validate. A --help
// request returns flag.ErrHelp.
func loadConfig(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	// First pass: only to learn --config and --nvidia-config and reject
	// bad flag syntax early.
	var probe Config
	if err := flagSet(&probe, out).Parse(args); err != nil {
		return Config{}, err
	}
	if probe.Config == "" {
		probe.Config = getenv(envPrefix + "CONFIG")
	}

	cfg := defaults()
	var fileKeys map[string]json.RawMessage
	if probe.Config != "" {
		var err error
		if fileKeys, err = readConfigFile(probe.Config, &cfg); err != nil {
			return Config{}, err
		}
	}
	cfg.Config = probe.Config
	nvidia := cmp.Or(probe.NVIDIAConfig, getenv(envPrefix+"NVIDIA_CONFIG"), cfg.NVIDIAConfig)
	if nvidia != "" {
		if err := cfg.applyNVIDIAConfig(nvidia, fileKeys); err != nil {
			return Config{}, err
		}
	}

	// Env values go through the same parsers as flags.
	envFS := flagSet(&cfg, io.Discard)
	for _, o := range options {
		v, ok := lookup(getenv, o.envName())
		if !ok {
			continue
		}
		if err := envFS.Set(o.name, v); err != nil {
			return Config{}, fmt.Errorf("%s: env %s=%q: %w", o.name, o.envName(), v, err)
		}
	}

	// Second pass: flags override everything before them.
	fs := flagSet(&cfg, out)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return cfg, nil
}

func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

// readConfigFile merges the YAML file at path into cfg, refusing unknown
// keys so that a typo is an error rather than a silently ignored setting.
// It returns the file's top-level keys.
func readConfigFile(path string, cfg *Config) (map[string]json.RawMessage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, cfg); err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	var keys map[string]json.RawMessage
	if err := yaml.Unmarshal(b, &keys); err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	return keys, nil
}

// Validate checks every field, naming the option in each error.
func (c *Config) Validate() error {
	var errs []error
	add := func(name, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{name}, a...)...))
	}
	if err := c.gpuConfig().Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateSharing()...)
	if c.MIGStrategy == "" {
		add("mig-strategy", "must not be empty")
	}
	if c.DeviceListStrategy == "" {
		add("device-list-strategy", "must not be empty")
	}
	if c.DevicePluginDir == "" {
		add("device-plugin-dir", "must not be empty")
	}
	if c.HostRoot == "" {
		add("host-root", "must not be empty")
	} else if c.Simulate == "" {
		// A simulated node writes its own tree, possibly into a new dir.
		if fi, err := os.Stat(c.HostRoot); err != nil || !fi.IsDir() {
			add("host-root", "%q is not a directory", c.HostRoot)
		}
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		add("state-dir", "%q is not an absolute path", c.StateDir)
	}
	c.validateSimulate(add)
	if c.NVMLCallTimeout.Duration < 10*time.Millisecond {
		add("nvml-call-timeout", "%s is below 10ms", c.NVMLCallTimeout.Duration)
	}
	if c.RescanInterval.Duration < 0 {
		add("rescan-interval", "%s is negative", c.RescanInterval.Duration)
	}
	if c.ExitAfter.Duration < 0 {
		add("exit-after", "%s is negative", c.ExitAfter.Duration)
	}
	if c.MetricsAddress != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddress); err != nil {
			add("metrics-address", "%q is not host:port", c.MetricsAddress)
		}
	}
	if c.NodeName != "" {
		if msgs := validation.IsDNS1123Subdomain(c.NodeName); len(msgs) > 0 {
			add("node-name", "%q is not a valid node name: %s", c.NodeName, strings.Join(msgs, "; "))
		}
	}
	errs = append(errs, c.validateSections()...)
	if _, err := metrics.ParseDCGMNames(c.Metrics.DCGMNames); err != nil {
		errs = append(errs, err)
	}
	if err := c.DRA.Validate(c.MIGStrategy); err != nil {
		errs = append(errs, err)
	}
	if len(c.DRA.Kinds) > 0 {
		if c.NodeName == "" {
			add("dra.devices", "serving devices through DRA needs node-name (the pool is named after the node)")
		}
		if c.StateDir == "" {
			add("dra.devices", "serving devices through DRA needs state-dir (prepared claims are checkpointed there)")
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		add("log-format", "%q is not one of text, json", c.LogFormat)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		add("log-level", "%q is not one of debug, info, warn, error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// defaultStateDir is --state-dir's default.
const defaultStateDir = "/var/lib/gpu-node-agent"

// healthConfig is the health section plus what the monitor takes from the
// top level: the host root it reads the boot ID under and the state dir.
// A simulated node keeps the default state dir under its own host root, so
// a demo never writes the real /var/lib.
func (c *Config) healthConfig(hostRoot string) health.Config {
	h := c.Health.Config
	h.HostRoot = hostRoot
	h.StateDir = c.StateDir
	if c.Simulate != "" && c.StateDir == defaultStateDir {
		h.StateDir = filepath.Join(hostRoot, defaultStateDir)
	}
	return h
}

// kubeClient is the API client's rate limit.
func (c *Config) kubeClient() kubeapi.ClientConfig {
	return kubeapi.ClientConfig{QPS: c.KubeAPIQPS, Burst: c.KubeAPIBurst}
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return l, l.UnmarshalText([]byte(s))
	}
	return l, fmt.Errorf("unknown log level %q", s)
}

// Duration is a time.Duration written as "30s" in YAML and flags.
type Duration struct{ time.Duration }

// String formats the duration for help text and logs.
func (d Duration) String() string { return d.Duration.String() }

// Set parses a flag or env value.
func (d *Duration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// UnmarshalJSON reads "30s" (sigs.k8s.io/yaml turns YAML into JSON first).
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	if len(b) < 2 || b[0] != '"' {
		return fmt.Errorf("duration %s must be a string such as \"30s\"", b)
	}
	return d.Set(s)
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.Duration.String() + `"`), nil }

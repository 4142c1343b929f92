package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/metrics"
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/rdma"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// Config is what the agent serves and how: a validated configuration with
// defaults already applied (cmd/gpu-node-agent builds it from its flags).
type Config struct {
	// Version is reported in the build-info metric, the start log line
	// and the API client's user agent.
	Version string
	// DevicePluginDir is the kubelet's device-plugin directory.
	DevicePluginDir string
	// GPU configures the GPU resources; Open sets its HostRoot (the
	// hardware's) and Recorder.
	GPU gpu.Config
	// RescanInterval is how often the hardware is rediscovered (0: only on
	// Rescan and the hardware's own change signal).
	RescanInterval time.Duration
	// Health configures the health monitor; Open sets its HostRoot (the
	// hardware's) and MIGDevicesServed.
	Health health.Config
	// RDMA configures the RDMA resources and port watcher.
	RDMA rdma.Config

	// MetricsAddress is the /metrics, /healthz and /readyz listen address
	// (empty: none); MetricsWebConfigFile its exporter-toolkit web config.
	MetricsAddress       string
	MetricsWebConfigFile string
	// MetricsInterval is the metrics' NVML sampling interval (0: the
	// default); the sampler reads at the shorter of it and the health poll.
	MetricsInterval time.Duration
	// PodAttribution labels GPU series with the pod using the GPU, from
	// the kubelet's pod-resources socket under the host root.
	PodAttribution bool
	// DCGMNames is metrics.dcgmNames: which DCGM field names the
	// DCGM_ series are served under ("" the default, legacy).
	DCGMNames metrics.DCGMNames
	// Zombies configures the GPU process check (health.zombies); the
	// check runs unless Health.DisabledChecks names it.
	Zombies usage.ZombiesConfig

	// NodeName is this node's Kubernetes name; without it nothing talks to
	// the API server.
	NodeName string
	// PodUID is the agent pod's UID; with it the DRA kubelet plugin runs in
	// rolling-update mode (dra.PluginConfig.PodUID) and the device-plugin
	// sockets carry it (plugin.Options.Instance), so that an old and a new
	// pod can serve one node at once.
	PodUID string
	// Taint configures the node taint and condition (mode off: none).
	Taint kubeapi.TaintConfig
	// NodeLabels keeps the topology labels and annotations on the Node.
	NodeLabels bool
	// MoveAdvice keeps the move advice on the Node
	// (kubeapi.MoveAdviceAnnotation; needs NodeName): the pods whose
	// moving elsewhere would free a larger NVLink block, read from the
	// API server for their priority and owner. Advice only: nothing is
	// evicted. The fragmentation metrics carry the advice's numbers
	// either way.
	MoveAdvice bool
	// KubeClients builds the API clients; nil builds them from Kubeconfig
	// with KubeClient's rate limit.
	KubeClients func() (kubeapi.Clients, error)
	Kubeconfig  string
	KubeClient  kubeapi.ClientConfig
	// KubeRetry is the first delay between failed client builds (0: one
	// second).
	KubeRetry time.Duration

	// DRA says which device kinds are served through DRA instead of the
	// device plugin.
	DRA DRAConfig

	// Preflight configures the active checks: with Enabled the node is
	// tainted until a full preflight passes (needs NodeName); with
	// RecheckInterval the GPUs no pod holds are re-checked.
	Preflight preflight.Config

	// Remediation configures the self-healing steps (GPU reset, drain,
	// reboot request); all off by default. It needs NodeName.
	Remediation remediate.Config

	// PrintInventory prints what is served at start and on every change.
	PrintInventory bool
}

// needsAPI says whether anything talks to the API server: only with a
// node name, and only for tainting, labels, the move advice, the GPU
// process check's Events or the preflight gate.
func (c Config) needsAPI() bool {
	return c.NodeName != "" && (c.Taint.WithDefaults().Mode != kubeapi.TaintOff || c.NodeLabels || c.MoveAdvice ||
		c.Health.Enabled(health.CheckGPUProcesses) || c.Preflight.Enabled || c.Remediation.Enabled())
}

// sampleInterval is the NVML sampling period: the shorter of the health
// poll and metrics intervals, so each counter is read once for both.
func (c Config) sampleInterval() time.Duration {
	h := c.Health.PollInterval
	if h == 0 {
		h = health.Config{}.WithDefaults().PollInterval
	}
	if m := c.MetricsInterval; m > 0 && m < h {
		return m
	}
	return h
}

// Agent is an opened agent: every part built, nothing served until Run.
type Agent struct {
	cfg       Config
	log       *slog.Logger
	hw        Hardware
	nics      *rdma.NICs
	reg       *prometheus.Registry
	mgr       *plugin.Manager
	mon       *health.Monitor
	collector *metrics.Collector
	sampler   *nvmlowner.Sampler
	tracker   *usage.Tracker
	watcher   *rdma.Watcher
	// counters is nil unless the watcher runs and the port counter check
	// is on.
	counters *rdma.PortCounters
	// node is nil unless a node name and tainting, labels, the move
	// advice, the GPU process check or DRA are set.
	node *kubeapi.NodeObject
	// split says which API serves each device kind; dra is nil unless
	// DRA serves or should serve one.
	split *apiSplit
	dra   *draServer
	// clients builds the API clients once for every part that needs them.
	clients *clientsOnce
	rec     *reconciler
	// preflight is nil unless the preflight gates the node or re-checks
	// idle GPUs.
	preflight *preflighter
	// remediator is nil unless a remediation step is enabled.
	remediator *remediate.Remediator
	// labelsHeld is why the last discovery was not labelled ("" when it
	// was); reconciler goroutine only.
	labelsHeld string
	rescan     chan struct{}

	closeOnce sync.Once
}

// Open builds every part of the agent on hw, which it owns from here on:
// Run, Close or a failing Open closes it. stdout gets the inventory. It
// fails only on errors that leave nothing to serve.
func Open(cfg Config, hw Hardware, log *slog.Logger, stdout io.Writer) (_ *Agent, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: log, hw: hw, rescan: make(chan struct{}, 1)}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	hostRoot := hw.HostRoot()
	// One registry for everything: Go/process collectors, build info, the
	// plugin manager, health, the GPU collector and the tainter.
	a.reg = metrics.NewRegistry(cfg.Version)
	a.mgr, err = plugin.NewManager(plugin.Options{
		Dir:        cfg.DevicePluginDir,
		Logger:     log.With("component", "plugin"),
		Registerer: a.reg,
		// The old and the new pod of a rolling update serve side by side,
		// each on its own sockets.
		Instance: plugin.InstanceFromPodUID(cfg.PodUID),
	})
	if err != nil {
		return nil, fmt.Errorf("device-plugin manager: %w", err)
	}
	hcfg := cfg.Health
	hcfg.HostRoot = hostRoot
	// Under --mig-strategy none the kubelet knows whole GPUs only: XIDs
	// tagged with a MIG instance go to the GPU (unless DRA serves MIG
	// devices).
	hcfg.MIGDevicesServed = cfg.GPU.MIGStrategy != gpu.MIGStrategyNone || slices.Contains(cfg.DRA.Kinds, dra.TypeMIG)
	if a.mon, err = health.NewMonitor(hcfg, hw.Owner(), log.With("component", "health"), a.reg); err != nil {
		return nil, err
	}
	// One sampler reads every GPU counter once per interval for health
	// and metrics alike, on the NVML owner's per-GPU lanes.
	a.sampler = nvmlowner.NewSampler(hw.Owner(), nvmlowner.SamplerConfig{Interval: cfg.sampleInterval()})
	a.mon.SetSampler(a.sampler)
	a.clients = newClientsOnce(cfg)
	if a.split, err = a.openSplit(); err != nil {
		return nil, err
	}
	if cfg.needsAPI() || a.split.active() {
		a.node = kubeapi.NewNodeObject(a.nodeConfig(), a.mon, a.reg, log.With("component", "node"))
	}
	if a.tracker, err = a.newTracker(hcfg, hostRoot); err != nil {
		return nil, err
	}
	if a.collector, err = a.newCollector(); err != nil {
		return nil, err
	}
	if a.preflight, err = a.newPreflighter(); err != nil {
		return nil, err
	}
	if a.remediator, err = a.newRemediator(); err != nil {
		return nil, err
	}
	rlog := log.With("component", "rdma")
	a.nics = rdma.OpenNICs(cfg.RDMA, rdma.NICsOptions{Root: hostRoot, Simulated: simulated(hw), Logger: rlog})
	if a.counters, err = a.nics.PortCounters(a.observeCounters, a.hostname(), rlog); err != nil {
		return nil, err
	}
	if a.counters != nil {
		if err := a.reg.Register(a.counters); err != nil {
			return nil, fmt.Errorf("rdma port counter metrics: %w", err)
		}
	}
	if a.watcher, err = a.nics.Watcher(a.observePort, rlog); err != nil {
		return nil, err
	}
	if cfg.GPU.DeviceListStrategy == gpu.DeviceListCDICRI {
		if err := a.nics.WriteCDISpec(); err != nil {
			return nil, err
		}
	}

	// The GPU resources record what they allocate so that an RDMA
	// allocation for the same container can prefer the NICs next to it.
	recent := rdma.NewRecent(0)
	gcfg := cfg.GPU
	gcfg.HostRoot = hostRoot
	if simulated(hw) {
		// The simulated node's device nodes live under its root.
		gcfg.HostDevPrefix = hostRoot
	}
	gcfg.Recorder = recent
	sources := []source{{
		name: "gpu",
		build: func(n *topology.Node) ([]plugin.Resource, error) {
			if n == nil {
				return nil, nil
			}
			// The solver is built per discovery, not per request.
			return gpu.Resources(n, gcfg, a.mon, topology.NewAllocator(n))
		},
	}}
	if a.split.active() {
		if a.dra, err = a.openDRA(hostRoot); err != nil {
			return nil, err
		}
	}
	if a.nics.Served() {
		cdi := cfg.GPU.DeviceListStrategy == gpu.DeviceListCDICRI
		sources = append(sources, source{name: "rdma", build: func(n *topology.Node) ([]plugin.Resource, error) {
			return a.nics.Resources(n, a.mon, cdi, recent)
		}})
	}
	onDiscover := []func(*topology.Node){a.mon.SetNode, a.collector.SetNode, a.tracker.SetNode,
		func(n *topology.Node) { a.sampler.SetTargets(nvmlowner.TargetsOf(n)) }}
	if a.node != nil {
		onDiscover = append(onDiscover, a.labelNode)
	}
	a.rec = &reconciler{
		log: log.With("component", "reconcile"),
		discover: func() (*topology.Node, error) {
			n, err := hw.Discover()
			if o := noteNVML(a.mon, cfg.Health, hostRoot, hw.LastNode(), err, log); o.Fatal && n != nil {
				// GPUs the bus shows and NVML does not list make the
				// discovery incomplete: the labels must not shrink.
				n.Unread = append(n.Unread, "gpu-missing: "+o.Reason)
			}
			a.nics.AddToNode(n)
			return n, err
		},
		onDiscover: onDiscover,
		sources:    sources,
		sync:       a.mgr.Sync,
		rescan:     cfg.RescanInterval,
		rediscover: []<-chan struct{}{changed(hw), a.sampler.LayoutChanged(), a.rescan},
		// Health changes and device kinds moving between the APIs re-sync
		// the plugin manager (and DRA) without rediscovery.
		resync: []<-chan struct{}{a.mon.Changes(), a.split.changed},
		// The device plugin serves the kinds DRA does not.
		filter: a.devicePluginResources,
	}
	if a.dra != nil {
		noExecute := cfg.DRA.NoExecute
		a.rec.publish = func(st state) { a.dra.publish(st, a.mon.Snapshot(), noExecute, a.drainDevices(st.node)) }
	}
	if cfg.PrintInventory {
		a.rec.report = (&inventory{out: stdout, what: describe(hw), fit: a.mon.NodeFit}).report
	}
	return a, nil
}

// labelNode hands a discovered node to the node object, whose labels and
// annotations follow it, only when the discovery was complete
// (topology.LabelsComplete): a GPU lost or hung, a read failing this time
// or a GPU missing from NVML would otherwise remove or change labels that
// node selectors rely on, and put them back a rescan later. The Node then
// keeps what the last complete discovery (of this run or an earlier one)
// wrote; only a complete discovery that differs changes it, in one patch.
// It runs on the reconciler's goroutine.
func (a *Agent) labelNode(n *topology.Node) {
	if a.dra != nil {
		n = a.dra.withoutMade(n)
	}
	why := topology.LabelsComplete(n)
	if why != a.labelsHeld {
		if why != "" {
			a.log.Warn("node labels kept as they are: discovery incomplete", "reason", why)
		} else if a.labelsHeld != "" {
			a.log.Info("node labels follow discovery again")
		}
		a.labelsHeld = why
	}
	if why == "" {
		a.node.SetNode(n)
	}
}

// observePort reports an RDMA port's state to the health monitor, so a
// port going down makes its device unhealthy in ListAndWatch.
func (a *Agent) observePort(id string, ok bool, reason string) {
	if a.counters != nil {
		// A port going down counts towards link flapping too.
		a.counters.NoteState(id, ok)
	}
	a.mon.Observe(health.Observation{DeviceID: id, Kind: health.KindNIC, Check: "rdma-port", Fatal: !ok, Cleared: ok, Reason: reason})
}

// observeCounters reports a port counter cause (a flapping link, an error
// counter rising too fast) to the health monitor, one cause per Key, so
// that the port is unhealthy in ListAndWatch and DRA like a port down.
func (a *Agent) observeCounters(id, cause string, bad bool, reason string) {
	a.mon.Observe(health.Observation{DeviceID: id, Kind: health.KindNIC, Check: rdma.CheckPortCounters, Key: cause,
		Fatal: bad, Cleared: !bad, Reason: reason})
}

// nodeConfig is the node object's configuration.
func (a *Agent) nodeConfig() kubeapi.NodeObjectConfig {
	cfg := a.cfg
	return kubeapi.NodeObjectConfig{
		NodeName:    cfg.NodeName,
		Taint:       cfg.Taint,
		Labels:      cfg.NodeLabels,
		MIGStrategy: cfg.GPU.MIGStrategy,
		Sharing:     cfg.GPU.TimeSlicing.LabelSharing(),
		NewClients:  a.clients.get,
		Retry:       cfg.KubeRetry,
		Preflight:   a.preflightGateConfig(),
		Remediation: cfg.Remediation.Enabled(),
		PodUID:      cfg.PodUID,
		MoveAdvice:  cfg.MoveAdvice,
	}
}

// newTracker builds the GPU usage tracker: the kubelet's pod-resources
// answers for the metrics' pod labels and the GPU process check (zombie,
// leaked, foreign use), after every sampling cycle. It asks the kubelet
// when either needs it.
func (a *Agent) newTracker(hcfg health.Config, hostRoot string) (*usage.Tracker, error) {
	judge := hcfg.Enabled(health.CheckGPUProcesses)
	ucfg := usage.Config{
		Zombies:          a.cfg.Zombies,
		Judge:            judge,
		HostRoot:         hostRoot,
		DevicePluginDir:  a.cfg.DevicePluginDir,
		MIGDevicesServed: hcfg.MIGDevicesServed,
		SimulatedPIDs:    simulated(a.hw),
	}
	if a.split.active() {
		// Devices of our DRA driver in this node's pool count as the
		// pods' that pod-resources lists them for.
		ucfg.DRAPool = a.cfg.NodeName
	}
	// The preflight skips held GPUs (its re-checks, and the disruptive
	// items of a gating run on a node in use); a GPU reset waits for the
	// pods holding the GPU; the move advice names the pods holding GPUs.
	pf := a.cfg.Preflight
	if a.cfg.PodAttribution || judge || pf.Enabled || pf.RecheckInterval > 0 || a.cfg.Remediation.Reset.Enabled || a.cfg.MoveAdvice {
		ucfg.PodResourcesSocket = usage.PodResourcesSocketPath(hostRoot)
	}
	// The fragmentation gauges (free GPUs, the largest free NVLink block,
	// free MIG devices, what the move advice would free) follow every
	// cycle's assignments; the node object keeps the advice on the Node.
	var fopts usage.FragmentationOptions
	if a.cfg.MoveAdvice && a.node != nil {
		fopts.Advice = a.node
	}
	frag := usage.NewFragmentation(a.hostname(), fopts)
	if err := a.reg.Register(frag); err != nil {
		return nil, fmt.Errorf("fragmentation metrics: %w", err)
	}
	opts := usage.Options{
		Samples:     a.sampler,
		Health:      a.mon,
		Offered:     a.offered,
		Allocations: frag,
		Logger:      a.log.With("component", "usage"),
		Registerer:  a.reg,
	}
	if a.node != nil {
		opts.Events = a.node
	}
	if s, ok := a.hw.(ProcessSignaller); ok {
		opts.Signaller = usage.StartTimeChecked(hostRoot, s.SignalProcess)
	}
	t, err := usage.NewTracker(ucfg, opts)
	if err != nil {
		return nil, fmt.Errorf("gpu usage tracker: %w", err)
	}
	return t, nil
}

// offered is the set of device IDs served to the kubelet as healthy now
// (the fragmentation collector counts free devices among them).
func (a *Agent) offered() map[string]bool {
	m := map[string]bool{}
	if a.rec == nil {
		return m
	}
	if a.dra != nil {
		maps.Copy(m, a.dra.offeredIDs())
	}
	for _, r := range a.rec.current().resources {
		for _, d := range r.Devices() {
			if d.Healthy {
				m[d.ID] = true
				// A time-sliced replica "<uuid>::<n>" offers its
				// device: the collector asks by GPU or MIG UUID.
				if base, _, ok := strings.Cut(d.ID, "::"); ok {
					m[base] = true
				}
			}
		}
	}
	return m
}

// hostname is the Hostname label of the agent's series: the node name, or
// the machine's host name without one (as dcgm-exporter's).
func (a *Agent) hostname() string {
	if a.cfg.NodeName != "" {
		return a.cfg.NodeName
	}
	h, _ := os.Hostname()
	return h
}

// newCollector builds the dcgm-exporter compatible GPU collector, serving
// the sampler's readings (it calls no NVML itself), labelled with the
// tracker's pods. Its XID metric comes from the health monitor, which owns
// the NVML event set (two event sets would each see only some of the
// events).
func (a *Agent) newCollector() (*metrics.Collector, error) {
	mc := metrics.Config{Hostname: a.hostname()}
	if a.cfg.PodAttribution {
		mc.Pods = a.tracker
	}
	mc.XIDs = a.mon
	mc.Names = a.cfg.DCGMNames
	// dcgm-exporter's DRA labels while DRA serves devices and the pods
	// are known (the tracker then counts our DRA pool's devices).
	mc.DRALabels = a.cfg.PodAttribution && a.split.active()
	c, err := metrics.NewCollector(a.sampler, mc, a.reg, a.log.With("component", "metrics"))
	if err != nil {
		return nil, fmt.Errorf("metrics collector: %w", err)
	}
	return c, nil
}

// Rescan asks for a rediscovery of the hardware (SIGHUP). Requests while
// one is pending coalesce.
func (a *Agent) Rescan() {
	select {
	case a.rescan <- struct{}{}:
	default:
	}
}

// Close releases the hardware and the netlink handle. Run closes them
// itself; Close is for an agent that is opened but never run. Later calls
// do nothing.
func (a *Agent) Close() {
	a.closeOnce.Do(func() {
		if a.nics != nil {
			a.nics.Close()
		}
		a.hw.Close()
	})
}

// Run serves until ctx is done or a part fails, then stops every server
// (removing the sockets), closes the hardware and returns the parts'
// errors.
func (a *Agent) Run(ctx context.Context) error {
	defer a.Close()
	cfg, log := a.cfg, a.log
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	log.Info("gpu-node-agent starting", "version", cfg.Version, "hardware", describe(a.hw), "hostRoot", a.hw.HostRoot(),
		"devicePluginDir", cfg.DevicePluginDir, "migStrategy", cfg.GPU.MIGStrategy, "deviceListStrategy", cfg.GPU.DeviceListStrategy)

	// The DRA kubelet plugin's sockets, like the metrics port, fail the
	// start before anything is served.
	if a.dra != nil {
		clients, err := a.clients.get()
		if err != nil {
			return fmt.Errorf("dra kubelet plugin: no Kubernetes API access: %w", err)
		}
		if err := a.dra.plugin.Start(ctx, clients.Core); err != nil {
			return err
		}
		defer a.dra.plugin.Stop()
	}
	// Listen before anything is served, so a port in use fails the start.
	var srv *metrics.Server
	if cfg.MetricsAddress != "" {
		var err error
		srv, err = metrics.Listen(metrics.ServerConfig{Address: cfg.MetricsAddress, WebConfigFile: cfg.MetricsWebConfigFile},
			a.reg, a.ready, log.With("component", "metrics"))
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		log.Info("metrics endpoint listening", "addr", srv.Addr().String())
	}

	// Every long-running part gets the same ctx; the first to fail stops
	// the rest.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	start := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				mu.Unlock()
				cancel()
			}
		}()
	}
	start("device-plugin manager", func() error { return a.mgr.Run(ctx) })
	start("reconcile", func() error { a.rec.run(ctx); return nil })
	start("health monitor", func() error { return a.mon.Run(ctx) })
	start("nvml sampler", func() error { return a.sampler.Run(ctx) })
	start("gpu usage tracker", func() error { return a.tracker.Run(ctx) })
	start("metrics collector", func() error { return a.collector.Run(ctx) })
	if a.watcher != nil {
		start("rdma watcher", func() error { return a.watcher.Run(ctx) })
	}
	if a.counters != nil {
		start("rdma port counters", func() error { return a.counters.Run(ctx) })
	}
	if a.node != nil {
		start("node object", func() error { return a.node.Run(ctx) })
	}
	if a.split.active() {
		start("device api split", func() error { a.split.run(ctx, splitRetry); return nil })
	}
	if a.preflight != nil {
		start("preflight", func() error { a.preflight.run(ctx); return nil })
	}
	if a.remediator != nil {
		start("remediation", func() error { a.remediator.Run(ctx); return nil })
	}
	if srv != nil {
		start("metrics", func() error { return srv.Serve(ctx) })
	}
	if r, ok := a.hw.(Runner); ok {
		start(describe(a.hw), func() error { return r.Run(ctx) })
	}
	wg.Wait()
	if len(errs) == 0 {
		log.Info("gpu-node-agent stopped")
	}
	return errors.Join(errs...)
}

// ready is /readyz: ready once devices were discovered and every served
// resource is registered with the kubelet (or nothing is served). A node
// whose NVML cannot load is not ready, so the failure shows on the pod.
func (a *Agent) ready() error {
	st := a.rec.current()
	if err := st.errs["discovery"]; err != nil {
		return fmt.Errorf("device discovery failed: %w", err)
	}
	if a.dra != nil {
		if ok, msg := a.dra.plugin.Registered(); !ok {
			return fmt.Errorf("the DRA kubelet plugin is not registered with the kubelet: %s", msg)
		}
	}
	registered := a.mgr.Registered()
	for _, r := range st.resources {
		if !registered[r.Name()] {
			return fmt.Errorf("%s is not registered with the kubelet", r.Name())
		}
	}
	return nil
}

package gpu

import (
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpu-node-agent/gpu-node-agent/plugin"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// ResourceGPU is the resource for whole GPUs, and for MIG devices under the
// single strategy.
const ResourceGPU = "nvidia.com/gpu"

// migResourcePrefix + profile names a MIG resource under the mixed strategy.
const migResourcePrefix = "nvidia.com/mig-"

// HealthView says whether a device, by GPU or MIG UUID, is fit for work. It
// is read on every device-list sync, so it must answer from a cache.
type HealthView interface {
	Healthy(id string) bool
}

// PreferredSolver chooses the best set of devices (GPU or MIG UUIDs, one
// kind per request) for a request; *topology.Allocator implements it. Pass a nil interface (not a typed nil
// pointer) when there is no solver.
type PreferredSolver interface {
	Preferred(available, mustInclude []string, size int) ([]string, error)
}

// Resources turns the node model into kubelet resources under cfg's MIG
// strategy, time-sliced as cfg.TimeSlicing says. Resources without devices
// are left out, so a MIG change can make a resource disappear. Each device
// is healthy only when health says so for it and, for a MIG device, for
// its parent GPU too; a GPU discovery marked lost is never healthy; a
// replica is healthy exactly when the device it shares is. Resources
// implement plugin.PreferredAllocator when solver is non-nil or they serve
// replicas. It fails when the node's MIG layout does not fit the strategy
// (see MIGStrategySingle) or the time-slicing section names devices the
// node does not have.
func Resources(node *topology.Node, cfg Config, health HealthView, solver PreferredSolver) ([]plugin.Resource, error) {
	if node == nil {
		return nil, errors.New("gpu resources: node model is nil")
	}
	if health == nil {
		return nil, errors.New("gpu resources: health view is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gpu resources: %w", err)
	}
	cfg = cfg.withDefaults()

	caps := loadMIGCaps(cfg.HostRoot)
	groups, err := group(node, cfg.MIGStrategy, caps)
	if err != nil {
		return nil, err
	}
	if groups, err = share(groups, cfg.TimeSlicing); err != nil {
		return nil, err
	}

	names := make([]string, 0, len(groups))
	for name := range groups {
		names = append(names, name)
	}
	sort.Strings(names)

	out := make([]plugin.Resource, 0, len(names))
	for _, name := range names {
		r := newResource(name, groups[name], cfg, health)
		if solver != nil || r.shared() {
			out = append(out, &preferredResource{resource: r, solver: solver})
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// group sorts the node's devices into resources by name.
func group(node *topology.Node, strategy string, caps migCaps) (map[string][]device, error) {
	groups := map[string][]device{}
	if strategy == MIGStrategyNone {
		// Like NVIDIA's plugin, MIG-enabled GPUs are still served whole here.
		for i := range node.GPUs {
			groups[ResourceGPU] = append(groups[ResourceGPU], gpuDevice(&node.GPUs[i]))
		}
		return groups, nil
	}

	var plain, migEnabled []int
	for i, g := range node.GPUs {
		switch {
		case !g.MIGEnabled:
			plain = append(plain, g.Index)
		case len(g.MIG) > 0:
			migEnabled = append(migEnabled, g.Index)
		}
		// A MIG-enabled GPU without MIG devices has nothing to offer: it can't
		// be used whole while MIG mode is on. NVIDIA's plugin refuses the
		// whole node then; we leave only that GPU out (one GPU's state must
		// not take down the rest, and it is a normal step of reconfiguring).
		if !g.MIGEnabled {
			groups[ResourceGPU] = append(groups[ResourceGPU], gpuDevice(&node.GPUs[i]))
		}
	}

	if strategy == MIGStrategySingle {
		if len(migEnabled) > 0 && len(plain) > 0 {
			return nil, fmt.Errorf("mig-strategy single: all GPUs must have the same MIG mode, but GPUs %s have MIG enabled and GPUs %s do not; use mig-strategy mixed", indexList(migEnabled), indexList(plain))
		}
		if err := sameProfile(node); err != nil {
			return nil, err
		}
	}

	for i := range node.GPUs {
		g := &node.GPUs[i]
		if !g.MIGEnabled {
			continue
		}
		for j := range g.MIG {
			name := ResourceGPU
			if strategy == MIGStrategyMixed {
				var err error
				if name, err = migResourceName(g.MIG[j].Profile); err != nil {
					return nil, fmt.Errorf("gpu %d mig device %s: %w", g.Index, g.MIG[j].UUID, err)
				}
			}
			groups[name] = append(groups[name], migDevice(g, &g.MIG[j], caps))
		}
	}
	return groups, nil
}

// sameProfile enforces the single strategy's rule that every MIG device is
// of one profile, so nvidia.com/gpu stays a fungible unit.
func sameProfile(node *topology.Node) error {
	var first string
	var firstGPU int
	for _, g := range node.GPUs {
		if !g.MIGEnabled {
			continue
		}
		for _, m := range g.MIG {
			if first == "" {
				first, firstGPU = m.Profile, g.Index
				continue
			}
			if m.Profile != first {
				return fmt.Errorf("mig-strategy single: MIG devices must all have one profile, but GPU %d has %s and GPU %d has %s; use mig-strategy mixed", firstGPU, first, g.Index, m.Profile)
			}
		}
	}
	return nil
}

// IsMIGResource reports whether name is a mixed-strategy MIG resource
// (nvidia.com/mig-<profile>).
func IsMIGResource(name string) bool { return strings.HasPrefix(name, migResourcePrefix) }

// migResourceName names a MIG profile's resource the way NVIDIA's plugin
// does: "mig-" + profile, with "+" (media extensions, e.g. 1g.10gb+me)
// turned into "." because "+" is not allowed in a resource name.
func migResourceName(profile string) (string, error) {
	if profile == "" {
		return "", errors.New("mig profile is empty")
	}
	name := migResourcePrefix + strings.ReplaceAll(profile, "+", ".")
	if errs := validation.IsQualifiedName(name); len(errs) > 0 {
		return "", fmt.Errorf("mig profile %q gives invalid resource name %q: %s", profile, name, strings.Join(errs, "; "))
	}
	return name, nil
}

func indexList(idx []int) string {
	s := make([]string, len(idx))
	for i, v := range idx {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

func numa(n int) []int64 {
	if n < 0 {
		return nil
	}
	return []int64{int64(n)}
}

func gpuDevice(g *topology.GPU) device {
	return device{
		id:        g.UUID,
		uuid:      g.UUID,
		index:     strconv.Itoa(g.Index),
		gpu:       g.UUID,
		numa:      numa(g.NUMANode),
		healthIDs: []string{g.UUID},
		lost:      g.Lost,
		nodes:     []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)},
	}
}

func migDevice(g *topology.GPU, m *topology.MIGDevice, caps migCaps) device {
	d := device{
		id:        m.UUID,
		uuid:      m.UUID,
		index:     fmt.Sprintf("%d:%d", g.Index, m.Index),
		gpu:       g.UUID,
		numa:      numa(g.NUMANode),
		healthIDs: []string{m.UUID, g.UUID},
		lost:      g.Lost,
		nodes:     []string{fmt.Sprintf("/dev/nvidia%d", g.Minor)},
	}
	// The GI and CI access capabilities are what lets a process open this
	// MIG device; without their /dev/nvidia-caps nodes CUDA can't use it.
	gi := fmt.Sprintf("gpu%d/gi%d/access", g.Minor, m.GPUInstance)
	ci := fmt.Sprintf("gpu%d/gi%d/ci%d/access", g.Minor, m.GPUInstance, m.ComputeInstance)
	for _, key := range []string{gi, ci} {
		minor, ok := caps.minors[key]
		if !ok {
			d.capsErr = missingCap(caps, key)
			break
		}
		d.nodes = append(d.nodes, fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor))
	}
	return d
}

func missingCap(caps migCaps, key string) error {
	if caps.err != nil && !errors.Is(caps.err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", migMinorsPath, caps.err)
	}
	return fmt.Errorf("%s has no entry for %s", migMinorsPath, key)
}

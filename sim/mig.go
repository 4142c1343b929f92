package sim

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// migProfile is one GPU instance profile a GPU model offers, with the compute
// instance profile that spans the whole GPU instance (the only kind a
// layout makes, as the NVIDIA device plugin expects).
type migProfile struct {
	name string
	// enum is the GPU_INSTANCE_PROFILE_* value (nvml.h) the profile is
	// asked for by: the key of the model's tables.
	enum int
	gi   nvml.GpuInstanceProfileInfo
	ci   nvml.ComputeInstanceProfileInfo
}

// migProfilesOf lists a model's MIG profiles by GPU instance profile ID.
func migProfilesOf(cfg gpus.Config) []migProfile {
	ids := make([]int, 0, len(cfg.MIGProfiles.GpuInstanceProfiles))
	for id := range cfg.MIGProfiles.GpuInstanceProfiles {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	var out []migProfile
	seen := map[string]bool{}
	for _, id := range ids {
		gi := cfg.MIGProfiles.GpuInstanceProfiles[id]
		var attrs []string
		if id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 || id == nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 {
			attrs = append(attrs, "me")
		}
		name := topology.MIGProfileName(int(gi.SliceCount), int(gi.SliceCount), gi.MemorySizeMB, cfg.MemoryMB<<20, attrs...)
		if seen[name] {
			continue
		}
		ci, ok := fullComputeInstance(cfg, id, gi.SliceCount)
		if !ok {
			continue
		}
		seen[name] = true
		out = append(out, migProfile{name: name, enum: id, gi: gi, ci: ci})
	}
	return out
}

// fullComputeInstance picks the compute instance profile covering all of a
// GPU instance's slices, preferring the lowest profile ID.
func fullComputeInstance(cfg gpus.Config, giProfile int, slices uint32) (nvml.ComputeInstanceProfileInfo, bool) {
	cis := cfg.MIGProfiles.ComputeInstanceProfiles[giProfile]
	ids := make([]int, 0, len(cis))
	for id := range cis {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		if cis[id].SliceCount == slices {
			return cis[id], true
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, false
}

func profileNames(ps []migProfile) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.name
	}
	return strings.Join(names, ", ")
}

// planMIG validates a MIG layout for a GPU model and returns its MIG devices:
// every name must be a profile of the model, no profile may exceed its
// instance count, and all of them must fit the GPU's slices at the model's
// legal placements. UUIDs derive from the parent, the generation and the
// layout, so the same layout applied at the same point is reproducible.
func planMIG(cfg gpus.Config, parentUUID string, generation int, names []string) ([]topology.MIGDevice, error) {
	if len(names) == 0 {
		return nil, nil
	}
	known := migProfilesOf(cfg)
	if len(known) == 0 {
		return nil, fmt.Errorf("%s does not support MIG", cfg.Name)
	}
	chosen := make([]migProfile, len(names))
	counts := map[string]int{}
	for i, name := range names {
		j := slices.IndexFunc(known, func(p migProfile) bool { return p.name == name })
		if j < 0 {
			return nil, fmt.Errorf("mig profile %q is not offered by %s (offered: %s)", name, cfg.Name, profileNames(known))
		}
		chosen[i] = known[j]
		counts[name]++
		if counts[name] > int(known[j].gi.InstanceCount) {
			return nil, fmt.Errorf("mig profile %q: %s allows at most %d instances", name, cfg.Name, known[j].gi.InstanceCount)
		}
	}
	places, ok := placeLayout(cfg, chosen, nil, nil)
	if !ok {
		return nil, fmt.Errorf("mig layout %v does not fit the slices of %s", names, cfg.Name)
	}
	used := map[int]bool{}
	out := make([]topology.MIGDevice, len(chosen))
	for i, p := range chosen {
		gi := giIDFor(int(p.gi.SliceCount), int(places[i].Start), used)
		out[i] = topology.MIGDevice{
			UUID:            deterministicUUID("MIG", parentUUID, generation, i, p.name),
			Profile:         p.name,
			GPUInstance:     gi,
			ComputeInstance: 0,
			MemoryMiB:       p.gi.MemorySizeMB,
			Index:           i,
			Attributes:      migAttributes(p.gi, p.ci),
			Placement:       topology.MIGPlacement{Start: places[i].Start, Size: places[i].Size},
		}
	}
	return out, nil
}

// slicesOf is the mask of the memory slices placement pl occupies (a size
// of 0 taken as one slice).
func slicesOf(pl nvml.GpuInstancePlacement) uint64 {
	size := max(pl.Size, 1)
	if pl.Start >= 64 || size >= 64 {
		return 0
	}
	return (uint64(1)<<size - 1) << pl.Start
}

// placeLayout finds a placement for every chosen profile among the model's
// legal ones (nvmlDeviceGetGpuInstancePossiblePlacements) so that none
// overlaps another or taken: largest first, backtracking, and for each
// profile the placements prefer approves first (nil: the table's order).
// A profile the model has no placements for cannot be placed.
func placeLayout(cfg gpus.Config, chosen []migProfile, taken []nvml.GpuInstancePlacement,
	prefer func(i int, pl nvml.GpuInstancePlacement) bool) ([]nvml.GpuInstancePlacement, bool) {
	order := make([]int, len(chosen))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		return chosen[order[a]].gi.SliceCount > chosen[order[b]].gi.SliceCount
	})
	var busy uint64
	for _, pl := range taken {
		busy |= slicesOf(pl)
	}
	places := make([]nvml.GpuInstancePlacement, len(chosen))
	var try func(k int, used uint64) bool
	try = func(k int, used uint64) bool {
		if k == len(order) {
			return true
		}
		i := order[k]
		candidates := slices.Clone(cfg.MIGProfiles.GpuInstancePlacements[chosen[i].enum])
		if prefer != nil {
			sort.SliceStable(candidates, func(a, b int) bool { return prefer(i, candidates[a]) && !prefer(i, candidates[b]) })
		}
		for _, pl := range candidates {
			mask := slicesOf(pl)
			if mask == 0 || used&mask != 0 {
				continue
			}
			places[i] = pl
			if try(k+1, used|mask) {
				return true
			}
		}
		return false
	}
	return places, try(0, busy)
}

// placeSpecLayout fills in the placements a spec's MIG layout (a snapshot
// made before placements were recorded, or written by hand) leaves out, so
// that GPU instances made later collide with its instances as they would
// on the GPU: for each device the legal placement its GPU instance ID
// stands for (giIDFor) if one fits, else any that fits. Placements the
// spec gives are kept. A layout that cannot be placed at all (a model
// without placement tables, or instances that do not fit them) keeps its
// placements unknown; nothing then collides with those instances.
func placeSpecLayout(cfg gpus.Config, profiles []migProfile, infos []topology.MIGDevice) bool {
	var chosen []migProfile
	var at []int
	var taken []nvml.GpuInstancePlacement
	for k, m := range infos {
		if m.Placement.Size > 0 {
			taken = append(taken, nvml.GpuInstancePlacement{Start: m.Placement.Start, Size: m.Placement.Size})
			continue
		}
		chosen = append(chosen, profiles[k])
		at = append(at, k)
	}
	if len(chosen) == 0 {
		return true
	}
	places, ok := placeLayout(cfg, chosen, taken, func(i int, pl nvml.GpuInstancePlacement) bool {
		return giIDFor(int(chosen[i].gi.SliceCount), int(pl.Start), map[int]bool{}) == infos[at[i]].GPUInstance
	})
	if !ok {
		return false
	}
	for i, k := range at {
		infos[k].Placement = topology.MIGPlacement{Start: places[i].Start, Size: places[i].Size}
	}
	return true
}

// giIDFor numbers GPU instances the way the driver does on A100/H100 (7g is
// GI 0, 3g/4g start at 1, 2g at 3, 1g at 7, offset by placement), taking the
// next free ID if that one is used.
func giIDFor(slices, start int, used map[int]bool) int {
	var id int
	switch {
	case slices >= 7:
		id = 0
	case slices >= 3:
		id = 1 + start/4
	case slices == 2:
		id = 3 + start/2
	default:
		id = 7 + start
	}
	for used[id] {
		id++
	}
	used[id] = true
	return id
}

// migProfileFor resolves a profile name for a model; for models the mocks do
// not describe it makes one up from the name so that snapshots of unknown
// GPUs still simulate.
func migProfileFor(cfg gpus.Config, name string) (migProfile, error) {
	for _, p := range migProfilesOf(cfg) {
		if p.name == name {
			return p, nil
		}
	}
	var g, gb int
	base, _, _ := strings.Cut(name, "+")
	if _, err := fmt.Sscanf(base, "%dg.%dgb", &g, &gb); err != nil || g <= 0 {
		return migProfile{}, fmt.Errorf("mig profile %q is not offered by %s", name, cfg.Name)
	}
	if len(cfg.MIGProfiles.GpuInstanceProfiles) > 0 {
		return migProfile{}, fmt.Errorf("mig profile %q is not offered by %s (offered: %s)", name, cfg.Name, profileNames(migProfilesOf(cfg)))
	}
	giIDs := map[int]uint32{1: nvml.GPU_INSTANCE_PROFILE_1_SLICE, 2: nvml.GPU_INSTANCE_PROFILE_2_SLICE,
		3: nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4: nvml.GPU_INSTANCE_PROFILE_4_SLICE, 6: nvml.GPU_INSTANCE_PROFILE_6_SLICE,
		7: nvml.GPU_INSTANCE_PROFILE_7_SLICE, 8: nvml.GPU_INSTANCE_PROFILE_8_SLICE}
	ciIDs := map[int]uint32{1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, 2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		3: nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, 4: nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 6: nvml.COMPUTE_INSTANCE_PROFILE_6_SLICE,
		7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, 8: nvml.COMPUTE_INSTANCE_PROFILE_8_SLICE}
	giID, ok := giIDs[g]
	if !ok {
		return migProfile{}, fmt.Errorf("mig profile %q: no GPU instance profile has %d slices", name, g)
	}
	return migProfile{
		name: name,
		enum: int(giID),
		gi:   nvml.GpuInstanceProfileInfo{Id: giID, SliceCount: uint32(g), InstanceCount: 7, MemorySizeMB: uint64(gb) * 1024},
		ci:   nvml.ComputeInstanceProfileInfo{Id: ciIDs[g], SliceCount: uint32(g), InstanceCount: 1},
	}, nil
}

// realisticMIG returns cfg with its GPU instance memory sizes capped at the
// eighth of the GPU's memory they stand for. The mocks give some profiles a
// little more memory than that (B200's 1g: 23552 of 184320 MiB), which real
// GPUs never report, and which would make NVIDIA's naming rule round them up
// to the next eighth ("1g.45gb" instead of "1g.23gb"). The mock's maps are
// shared package state, so they are copied, not changed.
func realisticMIG(cfg gpus.Config) gpus.Config {
	src := cfg.MIGProfiles.GpuInstanceProfiles
	if len(src) == 0 || cfg.MemoryMB == 0 {
		return cfg
	}
	dst := make(map[int]nvml.GpuInstanceProfileInfo, len(src))
	total := float64(cfg.MemoryMB)
	for id, p := range src {
		eighths := math.Round(float64(p.MemorySizeMB) * 8 / total)
		if eighths < 1 {
			eighths = 1
		}
		if limit := uint64(eighths * total / 8); p.MemorySizeMB > limit {
			p.MemorySizeMB = limit
		}
		dst[id] = p
	}
	cfg.MIGProfiles.GpuInstanceProfiles = dst
	return cfg
}

// migAttributes is what nvmlDeviceGetAttributes answers for a MIG device of
// GPU instance profile gi and compute instance profile ci (nvml.h
// nvmlDeviceAttributes_t): the compute instance's multiprocessors and
// slices, the GPU instance's slices and the engines it shares among its
// compute instances.
func migAttributes(gi nvml.GpuInstanceProfileInfo, ci nvml.ComputeInstanceProfileInfo) topology.MIGAttributes {
	return topology.MIGAttributes{
		Multiprocessors:       ci.MultiprocessorCount,
		GPUInstanceSlices:     gi.SliceCount,
		ComputeInstanceSlices: ci.SliceCount,
		CopyEngines:           gi.CopyEngineCount,
		Decoders:              gi.DecoderCount,
		Encoders:              gi.EncoderCount,
		JPEGs:                 gi.JpegCount,
		OFAs:                  gi.OfaCount,
	}
}

package health

import (
	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// checkInput is everything a sample check sees of one GPU: the sample just
// taken, the one before it (nil on the first since start), the GPU's
// persisted counter baselines and what its topology expects. Checks are
// pure functions of it: they never call NVML and keep no state of their
// own, so they are tested with hand-built samples.
type checkInput struct {
	UUID string
	Prev *nvmlowner.Sample
	Cur  *nvmlowner.Sample
	Cfg  Config
	// Baselines are the GPU's counter baselines by name (see the
	// baseline* keys); absent keys have never been set.
	Baselines map[string]uint64
	// ExpectedNVLinks is how many NVLinks (links 0..n-1) the GPU's model
	// has wired on its board and must be up; 0 when unknown.
	ExpectedNVLinks int
}

// checkResult is what a check found: observations, and baselines to store.
type checkResult struct {
	Obs       []Observation
	Baselines map[string]uint64
}

func (r *checkResult) add(o ...Observation) { r.Obs = append(r.Obs, o...) }

func (r *checkResult) setBaseline(key string, v uint64) {
	if r.Baselines == nil {
		r.Baselines = map[string]uint64{}
	}
	r.Baselines[key] = v
}

// sampleCheck is one polled check over samples, switched off by name.
type sampleCheck struct {
	name string
	// always checks cannot be disabled (the GPU answering at all, and
	// the evidence that releases held faults).
	always bool
	run    func(in *checkInput, out *checkResult)
}

// sampleChecks are the polled checks, in the order they run. A check whose
// readings the GPU does not give (NOT_SUPPORTED, NO_PERMISSION) says
// nothing: no data is never a fault.
var sampleChecks = []sampleCheck{
	{name: CheckLost, always: true, run: checkLost},
	{name: CheckReset, always: true, run: checkReset},
	{name: CheckECC, run: checkECC},
	{name: CheckRetired, run: checkRetired},
	{name: CheckRemap, run: checkRemap},
	{name: CheckNVLink, run: checkNVLink},
	{name: CheckFabric, run: checkFabric},
	{name: CheckRecovery, run: checkRecoveryAction},
}

// runSampleChecks runs every enabled check on one GPU's sample. A GPU that
// could not be read (lost, timed out) gets only the lost check's verdict:
// the others have no readings.
func runSampleChecks(in *checkInput) checkResult {
	var out checkResult
	for _, c := range sampleChecks {
		if !c.always && !in.Cfg.enabled(c.name) {
			continue
		}
		if in.Cur.Err != nil && c.name != CheckLost {
			continue
		}
		c.run(in, &out)
	}
	return out
}

// flag is a fatal observation while bad holds and a cleared one otherwise.
func flag(id, check, key string, bad bool, reason string) Observation {
	return Observation{DeviceID: id, Kind: KindGPU, Check: check, Key: key, Fatal: bad, Cleared: !bad, Reason: reason}
}

// ok returns the value of field f and whether the GPU gave it.
func ok(s *nvmlowner.Sample, f nvmlowner.Field) (uint64, bool) {
	if s == nil {
		return 0, false
	}
	v := s.Values[f]
	return v.V, v.Status == nvmlowner.OK
}

// Check names of the sample checks that are not in config.go's list.
const (
	// CheckTimeout is a GPU whose NVML calls did not return within the
	// call timeout (a hung GPU, e.g. a GSP timeout); it cannot be
	// disabled.
	CheckTimeout = "nvml-timeout"
	// CheckReset reports evidence that a GPU was reset or its driver
	// reloaded; it releases faults held until a reset.
	CheckReset = "reset"
	// CheckFabric is the NVSwitch fabric state of a GPU.
	CheckFabric = "fabric-not-ready"
	// CheckRecovery is the driver's own recovery action for a GPU
	// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
	CheckRecovery = "recovery-action"
)

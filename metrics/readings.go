package metrics

import (
	"errors"
	"fmt"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
)

// XIDSource reports the last XID seen on a GPU; the health monitor, which
// owns the NVML event set, implements it. ok is false when no XID has been
// seen, which is reported as 0 as dcgm-exporter does.
type XIDSource interface {
	LastXID(uuid string) (xid uint64, ok bool)
}

const mib = 1 << 20

// Reasons of gpu_node_agent_nvml_field_unavailable.
const (
	reasonNotSupported = "not-supported"
	reasonNoPermission = "no-permission"
)

// sampleError says why a GPU's sample counts as a collection error, or
// nil: the GPU could not be read at all (lost, timed out, library failure)
// or one of its readings failed. NotSupported and NoPermission are no
// data, never an error.
func sampleError(s *nvmlowner.Sample) error {
	if s.Err != nil {
		return s.Err
	}
	var errs []error
	for f := range nvmlowner.NumFields {
		if v := s.Values[f]; v.Status == nvmlowner.Failed {
			errs = append(errs, fmt.Errorf("read %s: %w", f, v.Err))
		}
	}
	for _, m := range s.MIG {
		for _, r := range []struct {
			what string
			v    nvmlowner.Value
		}{{"fb-used", m.FBUsed}, {"fb-free", m.FBFree}} {
			if r.v.Status == nvmlowner.Failed {
				errs = append(errs, fmt.Errorf("read mig %s %s: %w", m.UUID, r.what, r.v.Err))
			}
		}
	}
	return errors.Join(errs...)
}

// fieldProcessUtil names, in gpu_node_agent_nvml_field_unavailable, the
// per-process utilisation of a GPU with processes (Sample.ProcessUtilRead):
// NVML gives none before Maxwell or with MIG enabled.
const fieldProcessUtil = "process-utilization"

// reading is one of a sample's readings by the name the no-data metric
// gives it.
type reading struct {
	field string
	v     nvmlowner.Value
}

// readings lists s's per-GPU readings with their names: every field, then
// the processes' utilisation.
func readings(s *nvmlowner.Sample) []reading {
	out := make([]reading, 0, nvmlowner.NumFields+1)
	for f := range nvmlowner.NumFields {
		out = append(out, reading{f.String(), s.Values[f]})
	}
	return append(out, reading{fieldProcessUtil, s.ProcessUtilRead})
}

// unavailableReason is the no-data reason of v, or "" when v is not "no
// data".
func unavailableReason(v nvmlowner.Value) string {
	switch v.Status {
	case nvmlowner.NotSupported:
		return reasonNotSupported
	case nvmlowner.NoPermission:
		return reasonNoPermission
	}
	return ""
}

// valueOf converts the sampled reading behind field f, if it has one.
func valueOf(f field, v nvmlowner.Value) (float64, bool) {
	if v.Status != nvmlowner.OK {
		return 0, false
	}
	if conv := fieldSpecs[f].unit; conv != nil {
		return conv(v.V), true
	}
	return float64(v.V), true
}

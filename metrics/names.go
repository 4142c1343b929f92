package metrics

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// DCGMNames says under which names the DCGM_ series are served (agent
// config metrics.dcgmNames).
//
// DCGM 4.6 renamed many fields with a unit suffix and kept the old names
// as deprecated aliases of the same field ID (go-dcgm v1.4611.0,
// pkg/dcgm/dcgm_fields.h, "deprecated field names ... defined here for
// backward compatibility"; const_fields.go resolves both through
// GetFieldID, the old ones from legacyDCGMFields). dcgm-exporter names a
// series after the row of its counters csv that asked for the field
// (internal/pkg/counters/counter_config.go, FieldName: record[0]), so it
// serves the old name for an old row and the new one for a new row; its
// own etc/default-counters.csv (tag 4.5.3-4.8.2, the newest) and NVIDIA's
// dashboard use the old names only.
type DCGMNames string

const (
	// DCGMNamesLegacy serves the names dcgm-exporter's default counters
	// and dashboard use (the default): one series per reading.
	DCGMNamesLegacy DCGMNames = "legacy"
	// DCGMNamesBoth serves every renamed field under both names, for a
	// migration: the renamed fields' series are doubled.
	DCGMNamesBoth DCGMNames = "both"
	// DCGMNamesCurrent serves DCGM 4.6's names only (and labels the
	// driver version DCGM_FI_SYSTEM_DRIVER_VERSION): NVIDIA's dashboard
	// no longer finds the renamed fields.
	DCGMNamesCurrent DCGMNames = "current"
)

// DefaultDCGMNames is the default of metrics.dcgmNames.
const DefaultDCGMNames = DCGMNamesLegacy

// ParseDCGMNames checks a metrics.dcgmNames value; "" is the default.
func ParseDCGMNames(s string) (DCGMNames, error) {
	switch n := DCGMNames(s); n {
	case "":
		return DefaultDCGMNames, nil
	case DCGMNamesLegacy, DCGMNamesBoth, DCGMNamesCurrent:
		return n, nil
	}
	return "", fmt.Errorf("metrics.dcgmNames %q: must be %s, %s or %s", s, DCGMNamesLegacy, DCGMNamesBoth, DCGMNamesCurrent)
}

// namesOf are the names field s is served under in mode n, in
// exposition order: the legacy name first.
func namesOf(s fieldSpec, n DCGMNames) []string {
	switch {
	case s.current == "":
		return []string{s.name}
	case n == DCGMNamesBoth:
		return []string{s.name, s.current}
	case n == DCGMNamesCurrent:
		return []string{s.current}
	}
	return []string{s.name}
}

// FieldNames returns the names of the DCGM metrics this package can serve
// in mode n ("" the default), in exposition order. A GPU that does not
// support a field omits it.
func FieldNames(n DCGMNames) []string {
	if n == "" {
		n = DefaultDCGMNames
	}
	var names []string
	for _, s := range fieldSpecs {
		names = append(names, namesOf(s, n)...)
	}
	return names
}

// newFieldDescs builds, per field, one Desc per name it is served under
// in mode n, with the device label set (the DRA labels when dra).
func newFieldDescs(n DCGMNames, dra bool) [numFields][]*prometheus.Desc {
	var descs [numFields][]*prometheus.Desc
	labels := deviceLabelNames(n, dra)
	for i, s := range fieldSpecs {
		for _, name := range namesOf(s, n) {
			descs[i] = append(descs[i], prometheus.NewDesc(name, s.help, labels, nil))
		}
	}
	return descs
}

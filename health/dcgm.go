package health

import (
	"context"
	"errors"
)

// DCGM is an optional second source of health: DCGM's health watches and
// policy violations. Observations carry GPU UUIDs as DeviceID. The real
// implementation (go-dcgm) is used only when libdcgm.so.4 loads; tests use
// a fake.
type DCGM interface {
	// Watch delivers observations to emit until ctx ends or DCGM fails.
	Watch(ctx context.Context, emit func(Observation)) error
	// Close releases DCGM.
	Close()
}

// SetDCGM makes d the DCGM source instead of loading libdcgm; call it
// before Run.
func (m *Monitor) SetDCGM(d DCGM) { m.dcgm = d }

// errDCGMOff means DCGM was switched off in the config.
var errDCGMOff = errors.New("dcgm switched off")

// runDCGM runs the DCGM source if there is one, retrying after failures.
// Without DCGM the monitor works from NVML alone, and says so once.
func (m *Monitor) runDCGM(ctx context.Context) {
	d := m.dcgm
	if d == nil {
		var err error
		d, err = openDCGM(m.cfg, m.log)
		if err != nil {
			if !errors.Is(err, errDCGMOff) {
				lvl := m.log.Info
				if m.cfg.DCGMMode != DCGMAuto {
					lvl = m.log.Error
				}
				lvl("dcgm not available; health from nvml only", "mode", m.cfg.DCGMMode, "err", err)
			}
			return
		}
		m.log.Info("dcgm health watches enabled", "mode", m.cfg.DCGMMode, "address", m.cfg.DCGMAddress)
	}
	defer d.Close()
	for ctx.Err() == nil {
		emit := func(o Observation) {
			if o.Check == "" {
				o.Check = CheckDCGM
			}
			if o.XID != 0 && o.Fatal && !m.fatalXID(o.XID) {
				o.Fatal, o.Event = false, false
			}
			m.Observe(o)
		}
		if err := d.Watch(ctx, emit); err != nil && ctx.Err() == nil {
			m.log.Warn("dcgm watch failed; retrying", "err", err, "retry", m.cfg.PollInterval)
		}
		select {
		case <-ctx.Done():
		case <-m.clock.After(m.cfg.PollInterval):
		}
	}
}

func (m *Monitor) fatalXID(x uint64) bool {
	for _, f := range m.cfg.FatalXIDs {
		if f == x {
			return true
		}
	}
	return false
}

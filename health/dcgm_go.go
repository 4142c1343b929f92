package health

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/NVIDIA/go-dcgm/pkg/dcgm"
)

// goDCGM is the DCGM source on go-dcgm. go-dcgm dlopens libdcgm.so.4 at
// Init, so the agent builds and runs where the library is absent.
type goDCGM struct {
	log      *slog.Logger
	interval time.Duration
	cleanup  func()
	// failing remembers which health systems failed per GPU, to clear them.
	failing map[string]bool
}

// openDCGM starts an embedded hostengine, or connects to cfg.DCGMAddress
// (host:port, a unix socket path, or a tcp://, unix:// URL).
func openDCGM(cfg Config, log *slog.Logger) (DCGM, error) {
	cleanup, err := initDCGM(cfg)
	if err != nil {
		return nil, err
	}
	return &goDCGM{log: log, interval: cfg.PollInterval, cleanup: cleanup, failing: map[string]bool{}}, nil
}

// initDCGM starts DCGM as cfg.DCGMMode says and returns what stops it.
// go-dcgm counts its inits, so the health watches and the preflight's
// diagnostic may each hold one.
func initDCGM(cfg Config) (func(), error) {
	if cfg.DCGMMode == DCGMOff {
		return nil, errDCGMOff
	}
	var cleanup func()
	var err error
	if cfg.DCGMMode == DCGMStandalone || (cfg.DCGMMode == DCGMAuto && cfg.DCGMAddress != "") {
		socket := "0"
		if strings.HasPrefix(cfg.DCGMAddress, "/") {
			socket = "1"
		}
		cleanup, err = dcgm.Init(dcgm.Standalone, cfg.DCGMAddress, socket)
	} else {
		cleanup, err = dcgm.Init(dcgm.Embedded)
	}
	if err != nil {
		return nil, fmt.Errorf("dcgm init: %w", err)
	}
	return cleanup, nil
}

func (d *goDCGM) Close() { d.cleanup() }

func (d *goDCGM) Watch(ctx context.Context, emit func(Observation)) error {
	group := dcgm.GroupAllGPUs()
	if err := dcgm.HealthSet(group, dcgm.DCGM_HEALTH_WATCH_ALL); err != nil {
		return fmt.Errorf("dcgm health set: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	violations, err := dcgm.ListenForPolicyViolations(ctx,
		dcgm.DbePolicy, dcgm.PCIePolicy, dcgm.MaxRtPgPolicy, dcgm.NvlinkPolicy, dcgm.XidPolicy)
	if err != nil {
		return fmt.Errorf("dcgm policy violations: %w", err)
	}
	uuids := map[uint]string{}
	uuid := func(gpu uint) string {
		if u, ok := uuids[gpu]; ok {
			return u
		}
		info, err := dcgm.GetDeviceInfo(gpu)
		if err != nil {
			return ""
		}
		uuids[gpu] = info.UUID
		return info.UUID
	}
	t := time.NewTicker(d.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case v, ok := <-violations:
			if !ok {
				return fmt.Errorf("dcgm policy violation channel closed")
			}
			o := Observation{DeviceID: uuid(v.GPU), Kind: KindGPU, Check: CheckDCGM, Key: "policy " + string(v.Condition),
				Fatal: true, Event: true, Reason: "dcgm: " + string(v.Condition)}
			if x, ok := v.Data.(dcgm.XidPolicyCondition); ok {
				o.XID = uint64(x.ErrNum)
				o.Reason = fmt.Sprintf("dcgm: xid %d", x.ErrNum)
			}
			if o.DeviceID != "" {
				emit(o)
			}
		case <-t.C:
			resp, err := dcgm.HealthCheck(group)
			if err != nil {
				return fmt.Errorf("dcgm health check: %w", err)
			}
			now := map[string]bool{}
			for _, inc := range resp.Incidents {
				id := uuid(inc.EntityInfo.EntityId)
				if inc.Health != dcgm.DCGM_HEALTH_RESULT_FAIL || id == "" {
					continue
				}
				key := fmt.Sprintf("health %#x", uint(inc.System))
				now[id+"\x00"+key] = true
				emit(Observation{DeviceID: id, Kind: KindGPU, Check: CheckDCGM, Key: key, Fatal: true, Reason: "dcgm: " + inc.Error.Message})
			}
			for k := range d.failing {
				if !now[k] {
					id, key, _ := strings.Cut(k, "\x00")
					emit(Observation{DeviceID: id, Kind: KindGPU, Check: CheckDCGM, Key: key, Cleared: true})
				}
			}
			d.failing = now
		}
	}
}

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/dra"
	"github.com/gpu-node-agent/gpu-node-agent/gpu"
)

// SharingSection is the `sharing` config key. Only timeSlicing exists;
// `mps` (NVIDIA's other sharing strategy) is refused by name.
type SharingSection struct {
	// TimeSlicing is sharing.timeSlicing, in NVIDIA's form; nil: nothing
	// is shared.
	TimeSlicing *gpu.TimeSlicing `json:"timeSlicing,omitempty"`
}

// UnmarshalJSON reads the section strictly: unknown keys are errors.
func (s *SharingSection) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return fmt.Errorf("sharing: want an object, got %s", b)
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		switch k {
		case "timeSlicing":
		case "mps":
			return errors.New(gpu.MPSRefused)
		default:
			return fmt.Errorf("unknown field sharing.%s (known: timeSlicing)", k)
		}
	}
	ts, ok := raw["timeSlicing"]
	if !ok || string(ts) == "null" {
		return nil
	}
	t := &gpu.TimeSlicing{}
	if err := t.UnmarshalJSON(ts); err != nil {
		return err
	}
	s.TimeSlicing = t
	return nil
}

// gpuConfig is the GPU resources' configuration (Open adds the host root
// and the allocation recorder).
func (c *Config) gpuConfig() gpu.Config {
	return gpu.Config{
		MIGStrategy:        c.MIGStrategy,
		DeviceListStrategy: c.DeviceListStrategy,
		PassDeviceSpecs:    c.PassDeviceSpecs,
		TimeSlicing:        c.Sharing.TimeSlicing,
	}
}

// applyNVIDIAConfig reads NVIDIA's device-plugin config file at path into
// c: flags.migStrategy, flags.plugin.passDeviceSpecs and deviceListStrategy
// and sharing.timeSlicing (gpu.ParseNVIDIAConfig says what else it accepts
// and refuses). It sits between the agent's config file and the
// environment: a setting both files make must agree (a contradiction is an
// error naming both keys, so that neither silently wins), and GNA_*
// variables and flags override either. fileKeys are the top-level keys the
// agent's config file set.
func (c *Config) applyNVIDIAConfig(path string, fileKeys map[string]json.RawMessage) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("nvidia-config: %w", err)
	}
	nv, err := gpu.ParseNVIDIAConfig(b)
	if err != nil {
		return fmt.Errorf("nvidia-config %s: %w", path, err)
	}
	var errs []error
	conflict := func(ours, theirs string, a, b any) {
		errs = append(errs, fmt.Errorf("nvidia-config %s: %s is %v, but %s in %s is %v; set it in one file", path, theirs, b, ours, c.Config, a))
	}
	_, setMIG := fileKeys["mig-strategy"]
	if v := nv.MIGStrategy; v != nil {
		if setMIG && c.MIGStrategy != *v {
			conflict("mig-strategy", "flags.migStrategy", c.MIGStrategy, *v)
		}
		c.MIGStrategy = *v
	}
	_, setPass := fileKeys["pass-device-specs"]
	if v := nv.PassDeviceSpecs; v != nil {
		if setPass && c.PassDeviceSpecs != *v {
			conflict("pass-device-specs", "flags.plugin.passDeviceSpecs", c.PassDeviceSpecs, *v)
		}
		c.PassDeviceSpecs = *v
	}
	_, setList := fileKeys["device-list-strategy"]
	if v := nv.DeviceListStrategy; v != nil {
		if setList && c.DeviceListStrategy != *v {
			conflict("device-list-strategy", "flags.plugin.deviceListStrategy", c.DeviceListStrategy, *v)
		}
		c.DeviceListStrategy = *v
	}
	if nv.TimeSlicing != nil {
		if c.Sharing.TimeSlicing != nil {
			errs = append(errs, fmt.Errorf("nvidia-config %s: sharing.timeSlicing is also set in %s; set it in one file", path, c.Config))
		}
		c.Sharing.TimeSlicing = nv.TimeSlicing
	}
	c.NVIDIAConfig = path
	c.nvidiaIgnored = nv.Ignored
	return errors.Join(errs...)
}

// validateSharing checks what the time-slicing section cannot know alone:
// a kind DRA serves is shared only with dra.sharing (consumable capacity),
// never silently left unshared.
func (c *Config) validateSharing() []error {
	ts := c.Sharing.TimeSlicing
	if ts == nil {
		return nil
	}
	var errs []error
	for i, r := range ts.Resources {
		kind := dra.TypeGPU
		if gpu.IsMIGResource(r.Name) {
			kind = dra.TypeMIG
		}
		if slices.Contains(c.DRA.Kinds, kind) && !c.DRA.Sharing {
			errs = append(errs, fmt.Errorf("sharing.timeSlicing.resources[%d].name: %s cannot be shared: dra.devices serves %s devices through DRA, which shares them only with dra.sharing", i, r.Name, kind))
		}
	}
	return errs
}

// logNVIDIAIgnored logs, once, what --nvidia-config sets that changes
// nothing here.
func (c *Config) logNVIDIAIgnored(log *slog.Logger) {
	for _, msg := range c.nvidiaIgnored {
		key, why, _ := strings.Cut(msg, ": ")
		log.Warn("nvidia-config setting ignored", "file", c.NVIDIAConfig, "key", key, "why", why)
	}
}

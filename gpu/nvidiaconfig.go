package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// NVIDIAConfig is what the agent takes from a config file of NVIDIA's
// device plugin (`version: v1`, k8s-device-plugin v0.17-v0.20
// api/config/v1), so that a ConfigMap written for that plugin serves the
// same resources unchanged. A nil field was not set in the file.
type NVIDIAConfig struct {
	// MIGStrategy is flags.migStrategy.
	MIGStrategy *string
	// PassDeviceSpecs is flags.plugin.passDeviceSpecs.
	PassDeviceSpecs *bool
	// DeviceListStrategy is flags.plugin.deviceListStrategy.
	DeviceListStrategy *string
	// TimeSlicing is sharing.timeSlicing, with what NVIDIA's plugin does
	// to it before use applied (see ParseNVIDIAConfig).
	TimeSlicing *TimeSlicing
	// Ignored says, one line each, what the file sets that changes nothing
	// here and why; the caller logs it.
	Ignored []string
}

// nvidiaVersion is the only config version NVIDIA's plugin reads.
const nvidiaVersion = "v1"

// MPSRefused says why sharing.mps is refused, in either config file.
const MPSRefused = "sharing.mps: MPS is not supported (no MPS control daemon is run; see docs/sharing.md); use sharing.timeSlicing"

// ParseNVIDIAConfig reads NVIDIA's device-plugin config file (YAML or
// JSON). Every key is known: a key NVIDIA's v1 format does not have is an
// error naming it (NVIDIA's plugin ignores unknown keys; a typo must not
// silently change what is served). A setting the agent cannot honour is an
// error naming it and saying why: MPS sharing, the index device-ID
// strategy, CDI annotations, several device-list strategies, a driver root
// other than /, GDS/GDRCopy/MOFED, the NodeFeature API, IMEX channels, the
// packed allocation policy, a discovery strategy other than NVML. Settings
// that only matter to gpu-feature-discovery's own process or to NVIDIA's
// CDI spec generation change nothing here and are listed in Ignored.
//
// sharing.timeSlicing is taken as NVIDIA's plugin takes it: its binaries
// call DisableResourceNamingInConfig (cmd/nvidia-device-plugin/main.go),
// which drops a `rename` other than renameByDefault's <name>.shared and
// shares every device whatever `devices` says, with a warning. The same is
// done here (listed in Ignored), so the same ConfigMap serves the same
// resource names; the agent's own sharing.timeSlicing section honours both.
func ParseNVIDIAConfig(data []byte) (*NVIDIAConfig, error) {
	b, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("not YAML or JSON: %w", err)
	}
	if string(b) == "null" {
		return nil, errors.New("the file is empty")
	}
	raw, err := object("", b, "version", "flags", "resources", "sharing", "imex")
	if err != nil {
		return nil, err
	}
	c := &NVIDIAConfig{}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	ignore := func(format string, a ...any) { c.Ignored = append(c.Ignored, fmt.Sprintf(format, a...)) }

	var version string
	if err := decodeField(raw, "", "version", &version); err != nil {
		return nil, err
	}
	if version != "" && version != nvidiaVersion {
		fail("version: %q is not %s, the only version of NVIDIA's config file", version, nvidiaVersion)
	}
	if f, ok := raw["flags"]; ok && string(f) != "null" {
		if err := c.flags(f, fail, ignore); err != nil {
			return nil, err
		}
	}
	if r, ok := raw["resources"]; ok && string(r) != "null" {
		// NVIDIA's plugin warns "Customizing the 'resources' field is not
		// yet supported in the config. Ignoring..." and ignores it.
		if _, err := object("resources", r, "gpus", "mig"); err != nil {
			return nil, err
		}
		ignore("resources: ignored, as NVIDIA's plugin ignores it (resource names follow the MIG strategy)")
	}
	if s, ok := raw["sharing"]; ok && string(s) != "null" {
		if err := c.sharing(s, fail, ignore); err != nil {
			return nil, err
		}
	}
	if im, ok := raw["imex"]; ok && string(im) != "null" {
		if err := imex(im, fail); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

type reporter func(format string, a ...any)

func (c *NVIDIAConfig) flags(b []byte, fail, ignore reporter) error {
	raw, err := object("flags", b, "migStrategy", "failOnInitError", "mpsRoot", "nvidiaDriverRoot", "nvidiaDevRoot",
		"gdrcopyEnabled", "gdsEnabled", "mofedEnabled", "useNodeFeatureAPI", "deviceDiscoveryStrategy", "plugin", "gfd")
	if err != nil {
		return err
	}
	var s struct {
		MIGStrategy, MPSRoot, DriverRoot, DevRoot, Discovery *string
		FailOnInit, GDRCopy, GDS, MOFED, NodeFeatureAPI      *bool
	}
	for _, f := range []struct {
		key string
		v   any
	}{
		{"migStrategy", &s.MIGStrategy}, {"failOnInitError", &s.FailOnInit}, {"mpsRoot", &s.MPSRoot},
		{"nvidiaDriverRoot", &s.DriverRoot}, {"nvidiaDevRoot", &s.DevRoot}, {"gdrcopyEnabled", &s.GDRCopy},
		{"gdsEnabled", &s.GDS}, {"mofedEnabled", &s.MOFED}, {"useNodeFeatureAPI", &s.NodeFeatureAPI},
		{"deviceDiscoveryStrategy", &s.Discovery},
	} {
		if err := decodeField(raw, "flags", f.key, f.v); err != nil {
			return err
		}
	}
	if v := s.MIGStrategy; v != nil {
		if !slices.Contains(MIGStrategies, *v) {
			fail("flags.migStrategy: %q is not one of %s", *v, strings.Join(MIGStrategies, ", "))
		}
		c.MIGStrategy = v
	}
	if s.FailOnInit != nil {
		ignore("flags.failOnInitError: ignored: the agent never exits on an init error; a node whose GPUs NVML cannot reach is reported unfit and retried")
	}
	if s.MPSRoot != nil {
		ignore("flags.mpsRoot: ignored: used only by MPS sharing, which the agent does not offer")
	}
	for _, r := range []struct {
		key string
		v   *string
	}{{"nvidiaDriverRoot", s.DriverRoot}, {"nvidiaDevRoot", s.DevRoot}} {
		if r.v != nil && *r.v != "" && *r.v != "/" {
			fail("flags.%s: %q is not supported: the agent uses the driver installed on the host (host / under --host-root)", r.key, *r.v)
		}
	}
	for _, r := range []struct {
		key  string
		v    *bool
		what string
	}{{"gdrcopyEnabled", s.GDRCopy, "NVIDIA_GDRCOPY"}, {"gdsEnabled", s.GDS, "NVIDIA_GDS"}, {"mofedEnabled", s.MOFED, "NVIDIA_MOFED"}} {
		if r.v != nil && *r.v {
			fail("flags.%s: true is not supported: the agent does not set %s=enabled in containers", r.key, r.what)
		}
	}
	if s.NodeFeatureAPI != nil && *s.NodeFeatureAPI {
		fail("flags.useNodeFeatureAPI: true is not supported: the agent keeps gpu-feature-discovery's labels on the Node itself (--node-labels), not through NodeFeature objects")
	}
	if v := s.Discovery; v != nil && *v != "" && *v != "auto" && *v != "nvml" {
		fail("flags.deviceDiscoveryStrategy: %q is not supported: the agent discovers GPUs through NVML (auto and nvml are accepted)", *v)
	}
	if p, ok := raw["plugin"]; ok && string(p) != "null" {
		if err := c.pluginFlags(p, fail, ignore); err != nil {
			return err
		}
	}
	if g, ok := raw["gfd"]; ok && string(g) != "null" {
		if _, err := object("flags.gfd", g, "oneshot", "noTimestamp", "sleepInterval", "outputFile", "machineTypeFile"); err != nil {
			return err
		}
		ignore("flags.gfd: ignored: gpu-feature-discovery's own process settings; the agent sets its labels on the Node whenever they change, with no timestamp")
	}
	return nil
}

func (c *NVIDIAConfig) pluginFlags(b []byte, fail, ignore reporter) error {
	raw, err := object("flags.plugin", b, "passDeviceSpecs", "deviceListStrategy", "deviceIDStrategy",
		"cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot", "sharedDevicesAllocationPolicy")
	if err != nil {
		return err
	}
	var pass *bool
	if err := decodeField(raw, "flags.plugin", "passDeviceSpecs", &pass); err != nil {
		return err
	}
	c.PassDeviceSpecs = pass
	if v, ok := raw["deviceListStrategy"]; ok && string(v) != "null" {
		// One strategy or a list of them (NVIDIA's deviceListStrategyFlag).
		var list []string
		var one string
		switch {
		case json.Unmarshal(v, &one) == nil:
			list = []string{one}
		case json.Unmarshal(v, &list) == nil:
		default:
			return fmt.Errorf("flags.plugin.deviceListStrategy: %s: want a string or a list of strings", v)
		}
		switch {
		case len(list) != 1:
			fail("flags.plugin.deviceListStrategy: %v: the agent uses exactly one of %s", list, strings.Join(DeviceListStrategies, ", "))
		case list[0] == "cdi-annotations":
			fail("flags.plugin.deviceListStrategy: cdi-annotations is not supported (use cdi-cri)")
		case !slices.Contains(DeviceListStrategies, list[0]):
			fail("flags.plugin.deviceListStrategy: %q is not one of %s", list[0], strings.Join(DeviceListStrategies, ", "))
		default:
			c.DeviceListStrategy = &list[0]
		}
	}
	var idStrategy, policy *string
	if err := decodeField(raw, "flags.plugin", "deviceIDStrategy", &idStrategy); err != nil {
		return err
	}
	if idStrategy != nil && *idStrategy != "" && *idStrategy != "uuid" {
		fail("flags.plugin.deviceIDStrategy: %q is not supported: containers are given devices by UUID", *idStrategy)
	}
	if err := decodeField(raw, "flags.plugin", "sharedDevicesAllocationPolicy", &policy); err != nil {
		return err
	}
	if policy != nil && *policy != "" && *policy != "distributed" {
		fail("flags.plugin.sharedDevicesAllocationPolicy: %q is not supported: replicas are spread over GPUs (distributed)", *policy)
	}
	for _, key := range []string{"cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot"} {
		var s *string
		if err := decodeField(raw, "flags.plugin", key, &s); err != nil {
			return err
		}
		if s != nil {
			ignore("flags.plugin.%s: ignored: the agent writes no GPU CDI spec and no CDI annotation", key)
		}
	}
	return nil
}

func (c *NVIDIAConfig) sharing(b []byte, fail, ignore reporter) error {
	raw, err := object("sharing", b, "timeSlicing", "mps")
	if err != nil {
		return err
	}
	if m, ok := raw["mps"]; ok && string(m) != "null" {
		fail(MPSRefused)
	}
	ts, ok := raw["timeSlicing"]
	if !ok || string(ts) == "null" {
		return nil
	}
	var t TimeSlicing
	if err := t.UnmarshalJSON(ts); err != nil {
		return err
	}
	// What DisableResourceNamingInConfig does (api/config/v1/config.go,
	// replicas.go disableResoureRenaming).
	for i := range t.Resources {
		r := &t.Resources[i]
		path := fmt.Sprintf("%s.resources[%d]", timeSlicingPath, i)
		switch {
		case !t.RenameByDefault && r.Rename != "":
			ignore("%s.rename: %s ignored, as NVIDIA's plugin ignores it: the replicas are served as %s (the agent's own sharing section honours rename)", path, r.Rename, r.Name)
			r.Rename = ""
		case t.RenameByDefault && r.Rename != "" && r.Rename != r.Name+SharedSuffix:
			ignore("%s.rename: %s ignored, as NVIDIA's plugin ignores it: renameByDefault serves the replicas as %s%s", path, r.Rename, r.Name, SharedSuffix)
			r.Rename = ""
		}
		if !r.Devices.All() {
			ignore("%s.devices: ignored, as NVIDIA's plugin ignores it: every device of %s is shared (the agent's own sharing section honours devices)", path, r.Name)
			r.Devices = SharedDevices{}
		}
	}
	c.TimeSlicing = &t
	return nil
}

func imex(b []byte, fail reporter) error {
	raw, err := object("imex", b, "channelIDs", "required")
	if err != nil {
		return err
	}
	var ids []int
	var required bool
	if err := decodeField(raw, "imex", "channelIDs", &ids); err != nil {
		return err
	}
	if err := decodeField(raw, "imex", "required", &required); err != nil {
		return err
	}
	if len(ids) > 0 {
		fail("imex.channelIDs: %v: IMEX channels are not supported: the agent injects no /dev/nvidia-caps-imex-channels device", ids)
	}
	if required {
		fail("imex.required: true: IMEX channels are not supported")
	}
	return nil
}

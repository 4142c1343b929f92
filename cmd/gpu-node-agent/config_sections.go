package main

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/health"
	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
	"github.com/gpu-node-agent/gpu-node-agent/usage"
)

// HealthSection is the `health` config key: health.Config, with its
// durations written as "5m" in YAML, and its `zombies` block, the GPU
// process check's (package usage).
type HealthSection struct {
	health.Config
	// Zombies is health.zombies.
	Zombies usage.ZombiesConfig `json:"-"`
}

// UnmarshalJSON reads the section strictly (unknown keys are errors),
// health.zombies as a section of its own.
func (s *HealthSection) UnmarshalJSON(b []byte) error {
	var zombies json.RawMessage
	if err := unmarshalSection("health", b, &s.Config, func(raw map[string]json.RawMessage) {
		zombies = raw["zombies"]
		delete(raw, "zombies")
		// An unquoted `kernelLog: off` is a YAML 1.1 boolean by now.
		if string(raw["kernelLog"]) == "false" {
			raw["kernelLog"] = json.RawMessage(`"off"`)
		}
	}); err != nil {
		return err
	}
	if zombies == nil {
		return nil
	}
	return unmarshalSection("health.zombies", zombies, &s.Zombies)
}

// TaintSection is the `taint` config key: kubeapi.TaintConfig, with its
// durations written as "5m" in YAML.
type TaintSection struct{ kubeapi.TaintConfig }

// UnmarshalJSON reads the section strictly (unknown keys are errors).
// An unquoted `mode: on` or `mode: off` is a YAML 1.1 boolean by the time
// it gets here; it is read back as the word that was written.
func (s *TaintSection) UnmarshalJSON(b []byte) error {
	return unmarshalSection("taint", b, &s.TaintConfig, func(raw map[string]json.RawMessage) {
		switch string(raw["mode"]) {
		case "true":
			raw["mode"] = json.RawMessage(`"on"`)
		case "false":
			raw["mode"] = json.RawMessage(`"off"`)
		}
	})
}

// PreflightSection is the `preflight` config key: preflight.Config, read
// strictly with errors naming the key (e.g. preflight.command.timeout).
type PreflightSection struct{ preflight.Config }

// UnmarshalJSON reads the section strictly: an unknown key at any depth,
// or a value of the wrong form, is an error naming its path.
func (s *PreflightSection) UnmarshalJSON(b []byte) error {
	return decodeStrict("preflight", b, &s.Config)
}

// RemediationSection is the `remediation` config key: remediate.Config,
// read strictly with errors naming the key (e.g.
// remediation.reset.timeout).
type RemediationSection struct{ remediate.Config }

// UnmarshalJSON reads the section strictly (see decodeStrict).
func (s *RemediationSection) UnmarshalJSON(b []byte) error {
	return decodeStrict("remediation", b, &s.Config)
}

// Placement is the `placement` config key: advice on where pods go.
type Placement struct {
	// MoveAdvice keeps the move advice annotation on the Node
	// (agent.Config.MoveAdvice; --move-advice). Default true.
	MoveAdvice bool `json:"moveAdvice"`
}

// PlacementSection is the `placement` config key, read strictly with
// errors naming the key (e.g. placement.moveAdvice).
type PlacementSection struct{ Placement }

// UnmarshalJSON reads the section strictly (see decodeStrict).
func (s *PlacementSection) UnmarshalJSON(b []byte) error {
	return decodeStrict("placement", b, &s.Placement)
}

// decodeStrict decodes section b into v (a pointer to a struct whose
// durations unmarshal from text): an unknown key at any depth, or a value
// of the wrong form, is an error naming its path.
func decodeStrict[T any](section string, b []byte, v *T) error {
	if string(b) == "null" {
		return nil
	}
	if err := checkKeys(section, b, reflect.TypeFor[T]()); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return fmt.Errorf("%s.%s: want %s, got %s", section, typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return fmt.Errorf("%s: %w", section, err)
	}
	return nil
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// checkKeys walks the JSON value b against type t and returns an error
// naming path.key for the first key t has no field for, and path for the
// first value a text-unmarshalled field (a duration) refuses. Other type
// mismatches are left to the decoder, which names their field itself.
func checkKeys(path string, b []byte, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
			var typeErr *json.UnmarshalTypeError
			if errors.As(err, &typeErr) {
				return fmt.Errorf("%s: want a string, got %s", path, typeErr.Value)
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		var raw map[string]json.RawMessage
		if json.Unmarshal(b, &raw) != nil {
			return nil // not an object: the decoder says so
		}
		fields := map[string]reflect.Type{}
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if f.IsExported() && name != "-" && name != "" {
				fields[name] = f.Type
			}
		}
		for _, key := range slices.Sorted(maps.Keys(raw)) {
			ft, ok := fields[key]
			if !ok {
				return fmt.Errorf("%s.%s: unknown key (known: %s)", path, key, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
			}
			if err := checkKeys(path+"."+key, raw[key], ft); err != nil {
				return err
			}
		}
	case reflect.Slice:
		var raw []json.RawMessage
		if json.Unmarshal(b, &raw) != nil {
			return nil
		}
		for i, e := range raw {
			if err := checkKeys(fmt.Sprintf("%s[%d]", path, i), e, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

var durationType = reflect.TypeFor[time.Duration]()

// unmarshalSection decodes one config section into v (a pointer to a
// struct whose time.Duration fields encoding/json would read only as
// nanosecond integers), taking those durations as strings such as "30s",
// and refusing unknown keys as the rest of the file does.
func unmarshalSection(section string, b []byte, v any, fixups ...func(map[string]json.RawMessage)) error {
	if string(b) == "null" {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("%s: want an object: %w", section, err)
	}
	for _, f := range fixups {
		f(raw)
	}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type != durationType {
			continue
		}
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		msg, ok := raw[key]
		if !ok || key == "" {
			continue
		}
		var s string
		if err := json.Unmarshal(msg, &s); err != nil {
			return fmt.Errorf("%s.%s: duration %s must be a string such as \"30s\"", section, key, msg)
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("%s.%s: %w", section, key, err)
		}
		raw[key] = json.RawMessage(strconv.FormatInt(int64(d), 10))
	}
	nb, err := json.Marshal(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", section, err)
	}
	dec := json.NewDecoder(bytes.NewReader(nb))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", section, err)
	}
	return nil
}

// validatePreflightGate checks, for the agent (not the preflight
// subcommand, which runs the items whatever they say), what gating the
// node needs: the Node to taint.
func (c *Config) validatePreflightGate() error {
	if c.Preflight.Enabled && c.NodeName == "" {
		return errors.New("preflight.enabled: gating the node on the preflight needs node-name (the Node to taint)")
	}
	return nil
}

// validateRemediation checks the remediation section: what it needs of
// the node name.
func (c *Config) validateRemediation() error {
	r := c.Remediation.WithDefaults()
	if !r.Enabled() {
		return nil
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if c.NodeName == "" {
		return errors.New("remediation: the enabled steps need node-name (the Node they post Events on, take the fleet safeguard's slot for, evict from)")
	}
	return nil
}

// validateSections validates the health (with health.zombies), taint,
// metrics and rdma sections; each error names the field (e.g. health.pollInterval).
func (c *Config) validateSections() []error {
	var errs []error
	for _, err := range []error{c.Health.Validate(), c.Health.Zombies.Validate(), c.Taint.Validate(), c.RDMA.Validate(), c.kubeClient().Validate(),
		c.Preflight.Validate(), c.validateRemediation()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c.Metrics.Interval.Duration < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("metrics.interval (--metrics-interval) %s: must be at least 100ms", c.Metrics.Interval.Duration))
	}
	if c.Metrics.DeviceTimeout.Duration <= 0 {
		errs = append(errs, fmt.Errorf("metrics.deviceTimeout %s: must be positive", c.Metrics.DeviceTimeout.Duration))
	}
	if f := c.Metrics.WebConfigFile; f != "" {
		if _, err := os.Stat(f); err != nil {
			errs = append(errs, fmt.Errorf("metrics.webConfigFile (--web.config.file): %w", err))
		}
	}
	if c.Health.Zombies.Action == usage.ActionKill && !c.Health.Enabled(health.CheckGPUProcesses) {
		// Killing needs the check's verdicts; say so rather than kill
		// nothing silently.
		errs = append(errs, fmt.Errorf("health.zombies.action %q: needs the %s check, which health.disabledChecks switches off",
			usage.ActionKill, health.CheckGPUProcesses))
	}
	pf := kubeapi.PreflightGateConfig{TaintKey: c.Preflight.TaintKey, ConditionType: c.Preflight.ConditionType,
		EventNamespace: c.Taint.WithDefaults().EventNamespace}
	if err := pf.Validate(c.Taint.TaintConfig); err != nil {
		errs = append(errs, err)
	}
	if c.NodeName == "" && c.Taint.Mode != "" && c.Taint.Mode != kubeapi.TaintOff {
		// Asked for explicitly, tainting without a node name would
		// silently do nothing.
		errs = append(errs, fmt.Errorf("taint.mode (--taint-mode) %q: needs node-name", c.Taint.Mode))
	}
	return errs
}

func stdDuration(f func(*Config) *time.Duration) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.DurationVar(f(c), name, *f(c), usage) }
}

func float(f func(*Config) *float64) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.Float64Var(f(c), name, *f(c), usage) }
}

func integer(f func(*Config) *int) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.IntVar(f(c), name, *f(c), usage) }
}

func uintList(f func(*Config) *[]uint64) func(*flag.FlagSet, *Config, string, string) {
	return func(fs *flag.FlagSet, c *Config, name, usage string) { fs.Var((*uintListValue)(f(c)), name, usage) }
}

// uintListValue is a flag.Value for "79,48,94".
type uintListValue []uint64

func (v *uintListValue) String() string {
	if v == nil {
		return ""
	}
	s := make([]string, len(*v))
	for i, x := range *v {
		s[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(s, ",")
}

func (v *uintListValue) Set(s string) error {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		x, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number", f)
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return errors.New("empty list")
	}
	*v = out
	return nil
}

package main

import (
	"encoding"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gpu-node-agent/gpu-node-agent/gpu"
	"github.com/gpu-node-agent/gpu-node-agent/preflight"
	"github.com/gpu-node-agent/gpu-node-agent/remediate"
)

// configDoc is the page that documents every flag and config-file key.
const configDoc = "../../docs/configuration.md"

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDocConfigurationListsEveryOption keeps docs/configuration.md's flag
// table in step with the options: every flag and its environment variable
// must have a row.
func TestDocConfigurationListsEveryOption(t *testing.T) {
	doc := readDoc(t, configDoc)
	if len(options) == 0 {
		t.Fatal("no options")
	}
	rows := []string{"| `--config` | `" + envPrefix + "CONFIG` |"}
	for _, o := range options {
		rows = append(rows, "| `--"+o.name+"` | `"+o.envName()+"` |")
	}
	for _, row := range rows {
		if !strings.Contains(doc, row) {
			t.Errorf("docs/configuration.md has no table row starting %q", row)
		}
	}
}

// leafKeyTypes are struct types read as one value (a duration, a device
// list), not as a section of keys.
var leafKeyTypes = map[reflect.Type]bool{
	reflect.TypeFor[Duration]():          true,
	reflect.TypeFor[gpu.SharedDevices](): true,
}

// hiddenKeys are fields a section's UnmarshalJSON reads under a key their
// json tag does not give (HealthSection reads health.zombies itself).
var hiddenKeys = map[string]string{"HealthSection.Zombies": "zombies"}

// configKeys returns the config file's leaf keys under prefix, as the docs
// write them: "health.zombies.grace", "rdma.resources[].selectors.vendors".
// Fields without a json tag are read by their own UnmarshalJSON under
// their lowerCamel name (sharing.timeSlicing's, NVIDIA's form).
func configKeys(prefix string, t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8 {
		elem := t.Elem()
		for elem.Kind() == reflect.Pointer {
			elem = elem.Elem()
		}
		if elem.Kind() == reflect.Struct && !leafKeyTypes[elem] {
			return configKeys(prefix+"[]", elem)
		}
		return []string{prefix}
	}
	if t.Kind() != reflect.Struct || leafKeyTypes[t] || reflect.PointerTo(t).Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return []string{prefix}
	}
	var keys []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			keys = append(keys, configKeys(prefix, f.Type)...)
			continue
		}
		switch name {
		case "-":
			if name = hiddenKeys[t.Name()+"."+f.Name]; name == "" {
				continue
			}
		case "":
			r := []rune(f.Name)
			r[0] = unicode.ToLower(r[0])
			name = string(r)
		}
		p := name
		if prefix != "" {
			p = prefix + "." + name
		}
		keys = append(keys, configKeys(p, f.Type)...)
	}
	return keys
}

// TestDocConfigurationListsEveryKey: every key the config file accepts is
// in docs/configuration.md, the top-level ones as their flag's row, those
// of the sections (health, taint, ..., remediation) in backquotes with
// their full path.
func TestDocConfigurationListsEveryKey(t *testing.T) {
	doc := readDoc(t, configDoc)
	keys := configKeys("", reflect.TypeFor[Config]())
	// The sections have over a hundred keys: a walk that finds far fewer
	// has stopped looking, and would pass on anything.
	if len(keys) < 100 {
		t.Fatalf("found only %d config keys: %v", len(keys), keys)
	}
	for _, want := range []string{"health.zombies.killGrace", "rdma.resources[].selectors.linkTypes", "sharing.timeSlicing.resources[].replicas", "remediation.reset.retryWindow", "preflight.command.outputBytes"} {
		if !contains(keys, want) {
			t.Errorf("the walk of Config misses %s", want)
		}
	}
	for _, k := range keys {
		want := "`" + k + "`"
		if !strings.Contains(k, ".") {
			want = "| `--" + k + "` |"
		}
		if !strings.Contains(doc, want) {
			t.Errorf("docs/configuration.md does not list config key %s (as %s)", k, want)
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestDocREADMEQuickStart: the README opens with the two commands a
// newcomer runs first.
func TestDocREADMEQuickStart(t *testing.T) {
	readme := readDoc(t, "../../README.md")
	block, ok := firstCodeBlock(readme)
	if !ok {
		t.Fatal("README has no code block")
	}
	for _, s := range []string{"make demo", "make test"} {
		if !strings.Contains(block, s) {
			t.Errorf("the README's first code block does not run %q:\n%s", s, block)
		}
	}
	if !strings.Contains(readme, "go test -race ./...") {
		t.Error(`README does not say make test runs "go test -race ./..."`)
	}
}

// firstCodeBlock returns the body of the first fenced block of md.
func firstCodeBlock(md string) (string, bool) {
	_, rest, ok := strings.Cut(md, "```")
	if !ok {
		return "", false
	}
	_, rest, _ = strings.Cut(rest, "\n")
	block, _, ok := strings.Cut(rest, "```")
	return block, ok
}

// yamlBlock returns the yaml block of doc that starts with first (e.g.
// "preflight:"), first included.
func yamlBlock(t *testing.T, doc, first string) string {
	t.Helper()
	_, rest, ok := strings.Cut(doc, "```yaml\n"+first)
	if !ok {
		t.Fatalf("docs/configuration.md has no yaml block starting with %s", first)
	}
	block, _, _ := strings.Cut(rest, "```")
	return first + block
}

// TestDocPreflightExample: docs/configuration.md's preflight block is a
// configuration the agent reads, and it shows the defaults.
func TestDocPreflightExample(t *testing.T) {
	block := yamlBlock(t, readDoc(t, configDoc), "preflight:\n")
	path := filepath.Join(t.TempDir(), "preflight.yaml")
	if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := defaults()
	if _, err := readConfigFile(path, &cfg); err != nil {
		t.Fatalf("docs example: %v", err)
	}
	if err := cfg.Preflight.Validate(); err != nil {
		t.Fatalf("docs example: %v", err)
	}
	if diff := cmp.Diff(preflight.Config{}.WithDefaults(), cfg.Preflight.Config, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("the docs example is not the defaults (-defaults +docs):\n%s", diff)
	}
}

// TestDocRemediationExample: docs/configuration.md's remediation block is
// read by the config loader and is the defaults, every step off.
func TestDocRemediationExample(t *testing.T) {
	block := yamlBlock(t, readDoc(t, configDoc), "remediation:")
	path := filepath.Join(t.TempDir(), "remediation.yaml")
	if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := defaults()
	if _, err := readConfigFile(path, &cfg); err != nil {
		t.Fatalf("docs example: %v", err)
	}
	got := cfg.Remediation.WithDefaults()
	if err := got.Validate(); err != nil {
		t.Fatalf("docs example: %v", err)
	}
	if diff := cmp.Diff(remediate.Config{}.WithDefaults(), got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("the docs example is not the defaults (-defaults +docs):\n%s", diff)
	}
}

// TestDocConfigExamplesLoad: every yaml block of docs/configuration.md
// except the two checked above is a config file the agent reads and
// accepts.
func TestDocConfigExamplesLoad(t *testing.T) {
	doc := readDoc(t, configDoc)
	n := 0
	for _, part := range strings.Split(doc, "```yaml\n")[1:] {
		block, _, _ := strings.Cut(part, "```")
		n++
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := defaults()
		if _, err := readConfigFile(path, &cfg); err != nil {
			t.Errorf("docs example %d: %v\n%s", n, err, block)
		}
	}
	if n < 5 {
		t.Errorf("docs/configuration.md has %d yaml blocks, want the 5 examples", n)
	}
}

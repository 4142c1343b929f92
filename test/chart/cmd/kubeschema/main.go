// Command kubeschema writes the JSON schemas kubeconform validates
// manifests against, generated from the OpenAPI (swagger 2.0) document of
// the Kubernetes release the e2e cluster runs. kubeconform's own schemas
// (yannh/kubernetes-json-schema) are downloaded from GitHub, which this
// project's machines cannot reach; the same document ships in the
// k8s.io/kubernetes module (api/openapi-spec/swagger.json), which the Go
// module proxy serves.
//
// The output follows the layout and conventions of openapi2jsonschema's
// "--expanded --kubernetes --stand-alone --strict" mode that kubeconform's
// default schema location uses: one file per group/version/kind, named
// <kind>-<group's first label>-<version>.json, each carrying the
// definitions it references; objects with properties refuse unknown ones;
// int-or-string and quantity fields take strings and numbers; fields may be
// null.
//
//	go run ./cmd/kubeschema -kubernetes v1.37.2 -out DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

const refPrefix = "#/definitions/"

func main() {
	version := flag.String("kubernetes", "", "k8s.io/kubernetes module version whose swagger.json to use, e.g. v1.37.2")
	out := flag.String("out", "", "directory to write the schemas into")
	flag.Parse()
	if *version == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*version, *out); err != nil {
		slog.Error("kubeschema failed", "err", err)
		os.Exit(1)
	}
}

func run(version, out string) error {
	dir, err := moduleDir("k8s.io/kubernetes@" + version)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(filepath.Join(dir, "api", "openapi-spec", "swagger.json"))
	if err != nil {
		return fmt.Errorf("read swagger.json of k8s.io/kubernetes %s: %w", version, err)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("parse swagger.json: %w", err)
	}
	// resource.Quantity ("500m", "96Mi" or a plain number) is a string in
	// the document.
	if q, ok := doc.Definitions["io.k8s.apimachinery.pkg.api.resource.Quantity"]; ok {
		delete(q, "type")
		q["oneOf"] = []any{
			map[string]any{"type": []any{"string", "null"}},
			map[string]any{"type": []any{"number", "null"}},
		}
	}
	for _, def := range doc.Definitions {
		convert(def)
	}
	// Write to a temporary directory and rename, so an interrupted run
	// leaves no half-filled directory that later runs would trust.
	tmp := out + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("clear %s: %w", tmp, err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("create schema directory: %w", err)
	}
	n := 0
	for name, def := range doc.Definitions {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			kind, _ := gvk["kind"].(string)
			ver, _ := gvk["version"].(string)
			if kind == "" || ver == "" {
				continue
			}
			if err := write(tmp, fileName(group, ver, kind), name, doc.Definitions); err != nil {
				return err
			}
			n++
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return fmt.Errorf("clear %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("move schemas into place: %w", err)
	}
	slog.Info("wrote schemas", "kubernetes", version, "kinds", n, "dir", out)
	return nil
}

// moduleDir downloads module@version through the Go module proxy (or finds
// it in the module cache) and returns its directory.
func moduleDir(modVersion string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", modVersion)
	// Outside any module, so no go.mod is consulted or changed.
	cmd.Dir = os.TempDir()
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(b, &m); err != nil {
		return "", fmt.Errorf("parse go mod download output: %w", err)
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", modVersion, m.Error)
	}
	return m.Dir, nil
}

// fileName is kubeconform's schema file name for a group/version/kind
// (registry.schemaPath: "{{ .ResourceKind }}{{ .KindSuffix }}.json").
func fileName(group, version, kind string) string {
	suffix := ""
	if group != "" {
		suffix = "-" + strings.ToLower(strings.Split(group, ".")[0])
	}
	return strings.ToLower(kind) + suffix + "-" + strings.ToLower(version) + ".json"
}

// write writes the stand-alone schema of definition name: the definition
// itself with every definition it reaches under "definitions".
func write(dir, file, name string, defs map[string]map[string]any) error {
	reached := map[string]any{}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok && strings.HasPrefix(ref, refPrefix) {
				target := strings.TrimPrefix(ref, refPrefix)
				if _, seen := reached[target]; !seen {
					reached[target] = defs[target]
					walk(defs[target])
				}
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(defs[name])
	schema := map[string]any{"$schema": "http://json-schema.org/schema#"}
	for k, v := range defs[name] {
		schema[k] = v
	}
	if len(reached) > 0 {
		schema["definitions"] = reached
	}
	b, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		return fmt.Errorf("encode schema of %s: %w", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, file), b, 0o644); err != nil {
		return fmt.Errorf("write schema: %w", err)
	}
	return nil
}

// convert rewrites one schema node, and everything under it, in place.
func convert(s map[string]any) {
	if s["format"] == "int-or-string" {
		// intstr.IntOrString: a JSON string or integer.
		delete(s, "format")
		delete(s, "type")
		s["oneOf"] = []any{
			map[string]any{"type": []any{"string", "null"}},
			map[string]any{"type": []any{"integer", "null"}},
		}
	}
	if t, ok := s["type"].(string); ok {
		// Kubernetes accepts null for any field (it means unset).
		s["type"] = []any{t, "null"}
		if t == "object" {
			if _, ok := s["properties"]; ok {
				if _, set := s["additionalProperties"]; !set {
					s["additionalProperties"] = false
				}
			}
		}
	}
	if props, ok := s["properties"].(map[string]any); ok {
		keys := make([]string, 0, len(props))
		for k := range props {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if p, ok := props[k].(map[string]any); ok {
				convert(p)
			}
		}
	}
	for _, k := range []string{"items", "additionalProperties"} {
		if p, ok := s[k].(map[string]any); ok {
			convert(p)
		}
	}
}

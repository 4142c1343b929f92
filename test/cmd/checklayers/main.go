// Command checklayers fails, naming the import, when a package of the root
// module imports against the layering docs/architecture.md gives. The
// layering is the fenced block tagged `layers` in that page:
//
//	<layer>: <package> <package>/... ...
//	test-support: <package> ...
//
// Layers are listed from the bottom up. A product package may import only
// packages of lower layers (and its own subpackages); no product package
// may import a test-support package; every package of the module must be
// named. Only the product build's imports count (no build tags, no test
// files): a test may import what it needs.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the root module's directory")
	doc := flag.String("doc", "docs/architecture.md", "the page that gives the layers")
	flag.Parse()
	text, err := os.ReadFile(*doc)
	if err != nil {
		fail(err)
	}
	l, err := parseLayers(string(text))
	if err != nil {
		fail(fmt.Errorf("%s: %w", *doc, err))
	}
	pkgs, module, err := listPackages(*root)
	if err != nil {
		fail(err)
	}
	if problems := l.check(module, pkgs); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "check-layers:", p)
		}
		fmt.Fprintf(os.Stderr, "check-layers: %d problem(s); the layers are in %s\n", len(problems), *doc)
		os.Exit(1)
	}
	fmt.Printf("check-layers: %d packages import along the layers of %s\n", len(pkgs), *doc)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "check-layers:", err)
	os.Exit(2)
}

// testSupport is the name of the group of packages only tests and the
// simulator build use.
const testSupport = "test-support"

// layers is the parsed block: each pattern's layer (its index, bottom up;
// -1 for test support) and the layers' names.
type layers struct {
	names    []string
	patterns []pattern
}

type pattern struct {
	path  string // module-relative, without a /... suffix
	tree  bool   // path/... : path and everything below it
	layer int    // -1: test support
}

// parseLayers reads the first ```layers block of the page.
func parseLayers(page string) (*layers, error) {
	var l layers
	in, found := false, false
	sc := bufio.NewScanner(strings.NewReader(page))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case !in && line == "```layers":
			in, found = true, true
			continue
		case in && line == "```":
			in = false
		}
		if !in || line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, list, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: %q is not `layer: packages`", n, line)
		}
		layer := len(l.names)
		if name = strings.TrimSpace(name); name == testSupport {
			layer = -1
		} else {
			l.names = append(l.names, name)
		}
		for _, p := range strings.Fields(list) {
			pat := pattern{path: p, layer: layer}
			if s, ok := strings.CutSuffix(p, "/..."); ok {
				pat.path, pat.tree = s, true
			}
			l.patterns = append(l.patterns, pat)
		}
	}
	if !found {
		return nil, errors.New("no ```layers block")
	}
	if in {
		return nil, errors.New("the ```layers block is not closed")
	}
	return &l, nil
}

// layerOf is the layer of the module-relative package rel: the most
// specific pattern naming it wins.
func (l *layers) layerOf(rel string) (layer int, ok bool) {
	best := -1
	for _, p := range l.patterns {
		if rel == p.path || (p.tree && strings.HasPrefix(rel, p.path+"/")) {
			if len(p.path) > best {
				best, layer, ok = len(p.path), p.layer, true
			}
		}
	}
	return layer, ok
}

func (l *layers) name(layer int) string {
	if layer < 0 {
		return testSupport
	}
	return l.names[layer]
}

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// check returns every import against the layers, and every package the
// block does not name.
func (l *layers) check(module string, pkgs []pkg) []string {
	var out []string
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	for _, p := range pkgs {
		from, _ := rel(p.ImportPath)
		fl, ok := l.layerOf(from)
		if !ok {
			out = append(out, fmt.Sprintf("package %s is in no layer", from))
			continue
		}
		for _, imp := range p.Imports {
			to, ours := rel(imp)
			if !ours {
				continue
			}
			tl, ok := l.layerOf(to)
			switch {
			case !ok:
				// Reported as a package of its own.
			case fl < 0:
				// Test support may use anything.
			case tl < 0:
				out = append(out, fmt.Sprintf("%s (%s) imports %s: a product package must not import %s", from, l.name(fl), to, testSupport))
			case strings.HasPrefix(to, from+"/"):
				// A package's own subpackage.
			case tl >= fl:
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): imports go only to lower layers", from, l.name(fl), to, l.name(tl)))
			}
		}
	}
	return out
}

// listPackages runs go list in root: the module's path and its packages'
// non-test imports in the product build.
func listPackages(root string) ([]pkg, string, error) {
	mod, err := goList(root, "-m")
	if err != nil {
		return nil, "", err
	}
	module := strings.TrimSpace(string(mod))
	out, err := goList(root, "-json=ImportPath,Imports", "./...")
	if err != nil {
		return nil, "", err
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, "", fmt.Errorf("go list: %w", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, module, nil
}

func goList(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

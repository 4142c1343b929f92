package main

import (
	"slices"
	"strings"
	"testing"
)

const testPage = "# Architecture\n\n```layers\n# bottom up\nbase: internal/... topology\nnvml: nvmlowner\ndevices: gpu health\ncluster: kubeapi\ntest-support: sim sim/...\n```\n"

const mod = "example.com/m"

func TestCheck(t *testing.T) {
	l, err := parseLayers(testPage)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		pkgs []pkg
		want []string // substrings, one per problem, in order
	}{
		{name: "down the layers", pkgs: []pkg{
			{ImportPath: mod + "/kubeapi", Imports: []string{mod + "/health", mod + "/internal/signals", "fmt"}},
			{ImportPath: mod + "/health", Imports: []string{mod + "/nvmlowner", mod + "/topology"}},
			{ImportPath: mod + "/sim", Imports: []string{mod + "/kubeapi"}},
		}},
		{name: "up a layer", pkgs: []pkg{
			{ImportPath: mod + "/nvmlowner", Imports: []string{mod + "/health"}},
		}, want: []string{"nvmlowner (nvml) imports health (devices)"}},
		{name: "within a layer", pkgs: []pkg{
			{ImportPath: mod + "/gpu", Imports: []string{mod + "/health"}},
		}, want: []string{"gpu (devices) imports health (devices)"}},
		{name: "product imports test support", pkgs: []pkg{
			{ImportPath: mod + "/health", Imports: []string{mod + "/sim/simtest"}},
		}, want: []string{"health (devices) imports sim/simtest: a product package must not import test-support"}},
		{name: "own subpackage", pkgs: []pkg{
			{ImportPath: mod + "/internal/a", Imports: []string{mod + "/internal/a/b"}},
		}},
		{name: "unnamed package", pkgs: []pkg{
			{ImportPath: mod + "/newpkg", Imports: nil},
		}, want: []string{"package newpkg is in no layer"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := l.check(mod, tc.pkgs)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("problem %q, want it to say %q", got[i], tc.want[i])
				}
			}
		})
	}
}

func TestParseLayersErrors(t *testing.T) {
	for _, page := range []string{
		"no block here",
		"```layers\nbase: a\n",
		"```layers\nbase a b\n```\n",
	} {
		if _, err := parseLayers(page); err == nil {
			t.Errorf("parseLayers(%q) = nil error", page)
		}
	}
	l, err := parseLayers(testPage)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(l.names, []string{"base", "nvml", "devices", "cluster"}) {
		t.Errorf("layers %q", l.names)
	}
	if got, ok := l.layerOf("sim/simtest"); !ok || got != -1 {
		t.Errorf("sim/simtest in layer %d, %v; want test support", got, ok)
	}
}

package main

import (
	"bytes"
	"strings"
	"testing"
)

const dgx1v = "../../topology/testdata/solver/dgx1-volta.json"

func TestTopologyPreferred(t *testing.T) {
	gpu := func(i ...string) string {
		var out []string
		for _, s := range i {
			out = append(out, "GPU-dgx1-volta-"+s)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		name    string
		args    []string
		want    string   // first line of stdout
		contain []string // further stdout content
		wantErr string
	}{
		{name: "pair from four",
			// {0,2}130 + {4,5}150 is the best partition; {4,5} scores higher.
			args: []string{"--snapshot", dgx1v, "--available", gpu("0", "2", "4", "5"), "--size", "2"},
			want: gpu("4", "5")},
		{name: "available order does not matter",
			args: []string{"--snapshot", dgx1v, "--available", gpu("5", "4", "2", "0"), "--size", "2"},
			want: gpu("4", "5")},
		{name: "must include",
			args: []string{"--snapshot", dgx1v, "--available", gpu("0", "1", "2", "3", "4", "5", "6", "7"), "--must-include", gpu("4"), "--size", "4"},
			want: gpu("4", "5", "6", "7")},
		{name: "explain",
			args: []string{"--snapshot", dgx1v, "--available", gpu("0", "2", "4", "5"), "--size", "2", "--explain"},
			want: gpu("4", "5"),
			contain: []string{"partition (total 280)", gpu("0", "2") + "  130", gpu("4", "5") + "  150",
				"GPU-dgx1-volta-0  GPU-dgx1-volta-4  210", "chosen score:  150"}},
		{name: "unknown device", args: []string{"--snapshot", dgx1v, "--available", gpu("0") + ",GPU-x", "--size", "1"},
			wantErr: `unknown device "GPU-x"`},
		{name: "size out of range", args: []string{"--snapshot", dgx1v, "--available", gpu("0", "1"), "--size", "3"},
			wantErr: "size 3 out of range"},
		{name: "missing snapshot", args: []string{"--available", gpu("0"), "--size", "1"},
			wantErr: "--snapshot is required"},
		{name: "missing available", args: []string{"--snapshot", dgx1v, "--size", "1"},
			wantErr: "--available is required"},
		{name: "unreadable snapshot", args: []string{"--snapshot", "testdata/nope.json", "--available", gpu("0"), "--size", "1"},
			wantErr: "nope.json"},
		{name: "stray argument", args: []string{"--snapshot", dgx1v, "--available", gpu("0"), "--size", "1", "extra"},
			wantErr: `unexpected argument "extra"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runTopologyPreferred(tc.args, &stdout, &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			first, rest, _ := strings.Cut(stdout.String(), "\n")
			if first != tc.want {
				t.Errorf("first line %q, want %q", first, tc.want)
			}
			for _, c := range tc.contain {
				if !strings.Contains(rest, c) {
					t.Errorf("output lacks %q:\n%s", c, rest)
				}
			}
			if tc.contain == nil && rest != "" {
				t.Errorf("unexpected output after the answer: %q", rest)
			}
		})
	}
}

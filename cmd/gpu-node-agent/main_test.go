package main

import (
	"bytes"
	"io"
	"testing"
)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"version"}, &out, io.Discard, nil); code != 0 || out.String() != "gpu-node-agent dev\n" {
		t.Errorf("exit %d, output %q", code, out.String())
	}
}

package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/agentproc"
)

// TestSharedSources guards the two-version layout: every test file of
// test/conformance but version_test.go (the per-version adapter) is a
// symlink in test/conformance/kubelet134 to the same file, testdata too,
// so the 1.34 module runs exactly the tests the 1.37 one does and a new
// test file cannot be forgotten there.
func TestSharedSources(t *testing.T) {
	dir := filepath.Join(agentproc.RepoRoot(), "test", "conformance")
	other := filepath.Join(dir, "kubelet134")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	shared := []string{"testdata"}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), "_test.go") && e.Name() != "version_test.go" {
			shared = append(shared, e.Name())
		}
	}
	for _, name := range shared {
		target, err := os.Readlink(filepath.Join(other, name))
		if err != nil {
			t.Errorf("%s: %v (want a symlink to ../%s)", filepath.Join("kubelet134", name), err, name)
			continue
		}
		if target != filepath.Join("..", name) {
			t.Errorf("%s links to %s, want ../%s", filepath.Join("kubelet134", name), target, name)
		}
	}
	if fi, err := os.Lstat(filepath.Join(other, "version_test.go")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("kubelet134/version_test.go must be the 1.34 adapter, a file of its own: %v", err)
	}
	others, err := os.ReadDir(other)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range others {
		if strings.HasSuffix(e.Name(), ".go") && e.Name() != "version_test.go" && e.Type()&os.ModeSymlink == 0 {
			t.Errorf("kubelet134/%s is not a symlink: tests live in test/conformance and are shared", e.Name())
		}
	}
}

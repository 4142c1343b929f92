package cluster

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image references of the images the harness builds; they exist only in
// the cluster's containerd (pods must use imagePullPolicy Never or
// IfNotPresent).
const (
	PauseImage    = "localhost/gpu-node-agent-e2e/pause:1"
	WorkloadImage = "localhost/gpu-node-agent-e2e/workload:1"
	AgentImage    = "localhost/gpu-node-agent:e2e"
)

// ImageFile is one file copied into an image.
type ImageFile struct {
	// Src is the file on this machine (symlinks are followed).
	Src string
	// Dst is the absolute path in the image.
	Dst string
}

// ImageSpec describes a single-layer image built from files, without
// Docker.
type ImageSpec struct {
	Ref        string
	Files      []ImageFile
	Entrypoint []string
	Env        []string
}

// WriteImage writes spec as a docker-archive tarball at path.
func WriteImage(spec ImageSpec, path string) error {
	layerData, err := layerTar(spec.Files)
	if err != nil {
		return fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	})
	if err != nil {
		return fmt.Errorf("image %s: layer: %w", spec.Ref, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return fmt.Errorf("image %s: append layer: %w", spec.Ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("image %s: config: %w", spec.Ref, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint = spec.Entrypoint
	cfg.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, spec.Env...)
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return fmt.Errorf("image %s: set config: %w", spec.Ref, err)
	}
	tag, err := name.NewTag(spec.Ref)
	if err != nil {
		return fmt.Errorf("image %s: reference: %w", spec.Ref, err)
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("image %s: write %s: %w", spec.Ref, path, err)
	}
	return nil
}

// layerTar builds an uncompressed layer with the files, their parent
// directories and a world-writable /tmp.
func layerTar(files []ImageFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{"/tmp": true}
	for _, f := range files {
		for d := path.Dir(f.Dst); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var sorted []string
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted)
	for _, d := range sorted {
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode}); err != nil {
			return nil, fmt.Errorf("write dir %s: %w", d, err)
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.Src, err)
		}
		st, err := os.Stat(f.Src)
		if err != nil {
			return nil, fmt.Errorf("stat %s: %w", f.Src, err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: int64(st.Mode().Perm()), Size: int64(len(data))}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write header %s: %w", f.Dst, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.Dst, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

// GoImage builds a static binary from a main package of the test module
// (e.g. "./e2e/images/workload") and returns a spec running it.
func GoImage(ctx context.Context, ref, pkg, outDir string) (ImageSpec, error) {
	bin := filepath.Join(outDir, path.Base(pkg))
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = filepath.Join(repoRoot(), "test")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return ImageSpec{}, fmt.Errorf("build %s: %w: %s", pkg, err, out)
	}
	dst := "/" + path.Base(pkg)
	return ImageSpec{Ref: ref, Files: []ImageFile{{Src: bin, Dst: dst}}, Entrypoint: []string{dst}}, nil
}

// LoadImage writes spec as an archive in the cluster directory and imports
// it into the cluster's containerd (namespace k8s.io, where the kubelet's
// images live).
func (c *Cluster) LoadImage(ctx context.Context, spec ImageSpec) error {
	dir := filepath.Join(c.Dir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create image dir: %w", err)
	}
	file := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(spec.Ref)+".tar")
	if err := WriteImage(spec, file); err != nil {
		return err
	}
	if _, err := c.ctrCommand(ctx, "images", "import", file); err != nil {
		return fmt.Errorf("import image %s: %w", spec.Ref, err)
	}
	return nil
}

// importPause builds and imports the sandbox (pause) image.
func (c *Cluster) importPause(ctx context.Context) error {
	spec, err := GoImage(ctx, PauseImage, "./e2e/images/pause", filepath.Join(c.Dir, "images"))
	if err != nil {
		return err
	}
	return c.LoadImage(ctx, spec)
}

// LoadWorkloadImage builds and imports the workload image (prints its
// environment, then sleeps until terminated).
func (c *Cluster) LoadWorkloadImage(ctx context.Context) error {
	spec, err := GoImage(ctx, WorkloadImage, "./e2e/images/workload", filepath.Join(c.Dir, "images"))
	if err != nil {
		return err
	}
	return c.LoadImage(ctx, spec)
}

// AgentImageArchiveEnv names the agent image archive: a docker-archive
// tagged AgentImage, built from the repository's Dockerfile with buildah by
// `make image-local` (mk/image.mk). The e2e cluster runs that image, so
// what is tested is what users deploy.
const AgentImageArchiveEnv = "GNA_AGENT_IMAGE_ARCHIVE"

// DefaultAgentImageArchive is where `make image-local` writes the archive.
func DefaultAgentImageArchive() string {
	return filepath.Join(repoRoot(), ".build", "image", "gpu-node-agent-e2e.tar")
}

// ImportAgentImage imports the agent image archive (default
// $GNA_AGENT_IMAGE_ARCHIVE, else DefaultAgentImageArchive) into the
// cluster's containerd and checks it is there as AgentImage.
func (c *Cluster) ImportAgentImage(ctx context.Context, archive string) error {
	if archive == "" {
		archive = os.Getenv(AgentImageArchiveEnv)
	}
	if archive == "" {
		archive = DefaultAgentImageArchive()
	}
	if _, err := os.Stat(archive); err != nil {
		return fmt.Errorf("agent image archive: %w (run `make image-local`, or set %s)", err, AgentImageArchiveEnv)
	}
	if _, err := c.ctrCommand(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import agent image %s: %w", archive, err)
	}
	out, err := c.ctrCommand(ctx, "images", "ls", "-q")
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	for _, ref := range strings.Fields(out) {
		if ref == AgentImage {
			return nil
		}
	}
	return fmt.Errorf("import agent image %s: containerd has no %s afterwards (images: %s)", archive, AgentImage, strings.Join(strings.Fields(out), ", "))
}

package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// socketPrefix keeps our sockets apart from other plugins' in the shared
// device-plugin directory.
const socketPrefix = "gpu-node-agent-"

// maxSocketPath is the limit of sun_path (108 bytes including the NUL).
const maxSocketPath = 107

// socketName is the file name of a resource's socket: "nvidia.com/gpu" ->
// "gpu-node-agent-nvidia.com-gpu.sock", or with an instance tag
// "gpu-node-agent-nvidia.com-gpu-<instance>.sock". Anything but
// [A-Za-z0-9._-] becomes '-', so a resource name can never escape the
// directory.
func socketName(resource, instance string) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, resource)
	if instance != "" {
		safe += "-" + instance
	}
	return socketPrefix + safe + ".sock"
}

// maxInstance bounds an instance tag: the socket path must fit sun_path.
const maxInstance = 16

// checkInstance accepts an instance tag of 1 to maxInstance lower-case
// letters and digits, or none.
func checkInstance(instance string) error {
	if len(instance) > maxInstance {
		return fmt.Errorf("instance %q is longer than %d characters", instance, maxInstance)
	}
	for _, r := range instance {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') {
			return fmt.Errorf("instance %q: only lower-case letters and digits are allowed", instance)
		}
	}
	return nil
}

// InstanceFromPodUID is the instance tag for a pod: the first eight hex
// digits of its UID (random in a UUID v4), enough to tell the two pods of
// one node apart during a rolling update while keeping socket paths short.
// An empty UID gives no tag.
func InstanceFromPodUID(uid string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(uid) {
		if b.Len() == 8 {
			break
		}
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// staleAge is how old a socket that refuses connections must be to be
// removed as stale: a socket is bound a moment before its server listens,
// and in that moment it refuses connections too.
const staleAge = 30 * time.Second

// removeStaleSockets removes the sockets in dir that carry our prefix,
// were made more than staleAge ago and refuse connections: their server
// is gone (an agent that was killed before it could remove them, or a pod
// of an earlier rollout). A socket that accepts a connection belongs to a
// live agent (the other pod of a rolling update) and stays. It returns the
// names removed.
func removeStaleSockets(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read device-plugin dir: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, socketPrefix) || !strings.HasSuffix(name, ".sock") || e.Type()&fs.ModeSocket == 0 {
			continue
		}
		path := filepath.Join(dir, name)
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < staleAge {
			continue
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale socket %s: %w", name, err))
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// listenUnix listens on path, first removing a stale socket a previous run
// left behind. It refuses to remove anything that is not a socket. The
// listener does not unlink on Close: after a kubelet restart the path may
// already hold a newer socket, so removal goes through removeSocket.
func listenUnix(path string) (*net.UnixListener, os.FileInfo, error) {
	if len(path) > maxSocketPath {
		return nil, nil, fmt.Errorf("socket path %s is %d bytes, longer than the %d allowed", path, len(path), maxSocketPath)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, nil, fmt.Errorf("socket path %s exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, nil, fmt.Errorf("remove stale socket: %w", err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("listen on socket: %w", err)
	}
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("stat new socket: %w", err)
	}
	return l, fi, nil
}

// socketIntact reports whether path is still the socket we created; the
// kubelet removes every socket in its directory when it starts.
func socketIntact(path string, created os.FileInfo) bool {
	fi, err := os.Lstat(path)
	return err == nil && os.SameFile(fi, created)
}

// removeSocket removes path only if it is still the socket we created.
func removeSocket(path string, created os.FileInfo) error {
	if created == nil || !socketIntact(path, created) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove socket: %w", err)
	}
	return nil
}

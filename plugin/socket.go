package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"
)

// socketPrefix keeps our sockets apart from other plugins' in the shared
// device-plugin directory.
const socketPrefix = "gpu-node-agent-"

// maxSocketPath is the limit of sun_path (108 bytes including the NUL).
const maxSocketPath = 107

// socketName is the file name of a resource's socket: "nvidia.com/gpu" ->
// "gpu-node-agent-nvidia.com-gpu.sock". Anything but [A-Za-z0-9._-] becomes
// '-', so a resource name can never escape the directory.
func socketName(resource string) string {
	safe := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '-'
	}, resource)
	return socketPrefix + safe + ".sock"
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

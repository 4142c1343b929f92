package rdma

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// CDISpecFile is the file name WriteCDISpec uses in the CDI spec
// directory (/etc/cdi or /var/run/cdi).
const CDISpecFile = "gpu-node-agent.io-rdma.json"

// CDISpec defines every port as a CDI device named CDIVendor/CDIClass=<port
// ID>, whose edits are the port's character devices (PortCharDevs). The
// environment stays in the Allocate response: it depends on the whole set
// of ports a container gets.
func CDISpec(devs []Device) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: CDIVendor + "/" + CDIClass, Devices: []cdispec.Device{}}
	for _, d := range devs {
		for _, p := range d.Ports {
			dev := cdispec.Device{Name: d.PortID(p.Number)}
			for _, c := range d.PortCharDevs(p) {
				dev.ContainerEdits.DeviceNodes = append(dev.ContainerEdits.DeviceNodes, &cdispec.DeviceNode{
					Path: c.Path, HostPath: c.HostPath, Type: "c", Permissions: "rw",
				})
			}
			spec.Devices = append(spec.Devices, dev)
		}
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("cdi spec version: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// WriteCDISpec writes CDISpec(devs) to dir/CDISpecFile, replacing it
// atomically so a runtime never reads half a spec.
func WriteCDISpec(dir string, devs []Device) error {
	spec, err := CDISpec(devs)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode rdma cdi spec: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cdi spec dir %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".rdma-cdi-*.tmp")
	if err != nil {
		return fmt.Errorf("write rdma cdi spec in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write rdma cdi spec %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write rdma cdi spec %s: %w", tmp.Name(), err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("chmod rdma cdi spec: %w", err)
	}
	path := filepath.Join(dir, CDISpecFile)
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("install rdma cdi spec %s: %w", path, err)
	}
	return nil
}

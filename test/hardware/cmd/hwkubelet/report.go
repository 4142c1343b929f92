package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

// Report is what the fake kubelet writes: every registration, and per
// resource what ListAndWatch last said and what the calls it made
// returned.
type Report struct {
	Dir      string    `json:"dir"`
	Started  time.Time `json:"started"`
	Written  time.Time `json:"written"`
	Exercise bool      `json:"exercised"`
	// Error is why the run ended early (no plugin registered in time).
	Error         string               `json:"error,omitempty"`
	Registrations []Registration       `json:"registrations"`
	Resources     map[string]*Resource `json:"resources"`
}

// Resource is one registered resource as the kubelet sees it.
type Resource struct {
	Connected bool    `json:"connected"`
	Options   Options `json:"options"`
	// Updates counts the ListAndWatch responses received.
	Updates int      `json:"listAndWatchUpdates"`
	Devices []Device `json:"devices"`
	// Preferred are the GetPreferredAllocation calls (size 1 and 2 of the
	// healthy devices), made only when the plugin offers it.
	Preferred []PreferredCall `json:"preferred,omitempty"`
	// Allocate are the Allocate calls (1 device, and 2 when there are).
	Allocate []AllocateCall `json:"allocate,omitempty"`
}

// Device is one device of a ListAndWatch response.
type Device struct {
	ID     string `json:"id"`
	Health string `json:"health"`
	// NUMANodes are the topology's NUMA nodes; empty: no topology.
	NUMANodes []int64 `json:"numaNodes,omitempty"`
}

// PreferredCall is one GetPreferredAllocation call.
type PreferredCall struct {
	Size      int      `json:"size"`
	Available []string `json:"available"`
	DeviceIDs []string `json:"deviceIDs,omitempty"`
	Seconds   float64  `json:"seconds"`
	Error     string   `json:"error,omitempty"`
}

// AllocateCall is one Allocate call for one container.
type AllocateCall struct {
	DeviceIDs []string           `json:"deviceIDs"`
	Response  *ContainerResponse `json:"response,omitempty"`
	Seconds   float64            `json:"seconds"`
	Error     string             `json:"error,omitempty"`
}

// ContainerResponse is a ContainerAllocateResponse.
type ContainerResponse struct {
	Envs        map[string]string `json:"envs,omitempty"`
	Mounts      []Mount           `json:"mounts,omitempty"`
	Devices     []DeviceSpec      `json:"devices,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	CDIDevices  []string          `json:"cdiDevices,omitempty"`
}

// Mount is a Mount of an Allocate response.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

// DeviceSpec is a DeviceSpec of an Allocate response.
type DeviceSpec struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

func containerResponse(r *pluginapi.ContainerAllocateResponse) *ContainerResponse {
	out := &ContainerResponse{Envs: r.GetEnvs(), Annotations: r.GetAnnotations()}
	for _, m := range r.GetMounts() {
		out.Mounts = append(out.Mounts, Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadOnly()})
	}
	for _, d := range r.GetDevices() {
		out.Devices = append(out.Devices, DeviceSpec{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions()})
	}
	for _, c := range r.GetCdiDevices() {
		out.CDIDevices = append(out.CDIDevices, c.GetName())
	}
	return out
}

// resourcesOf is the kubelet's plugin table in report form; calls carries
// the calls already made, which the table does not hold.
func resourcesOf(plugins map[string]devicemanager.Plugin, calls map[string]*Resource) map[string]*Resource {
	out := map[string]*Resource{}
	for _, name := range slices.Sorted(maps.Keys(plugins)) {
		p := plugins[name]
		r := &Resource{Connected: p.Connected, Updates: p.Updates}
		if p.Options != nil {
			r.Options = optionsOf(p.Options)
		}
		r.Devices = devicesOf(p.Devices)
		if c, ok := calls[name]; ok {
			r.Preferred, r.Allocate = c.Preferred, c.Allocate
		}
		out[name] = r
	}
	return out
}

func devicesOf(devs []*pluginapi.Device) []Device {
	out := make([]Device, 0, len(devs))
	for _, d := range devs {
		dev := Device{ID: d.GetID(), Health: d.GetHealth()}
		for _, n := range d.GetTopology().GetNodes() {
			dev.NUMANodes = append(dev.NUMANodes, n.GetID())
		}
		out = append(out, dev)
	}
	slices.SortFunc(out, func(a, b Device) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// writeReport writes r as indented JSON to path, through a temporary file
// renamed into place, so a reader never sees half a report.
func writeReport(path string, r *Report) error {
	r.Written = time.Now()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".hwkubelet-*.json")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write report: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return os.Rename(tmp.Name(), path)
}

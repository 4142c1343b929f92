// Package compare holds what the agent saw on a node (the kit's
// agent/census.json and agent/topology.json, and what it served:
// run/kubelet.json and the DRA devices dra.Build makes of the topology)
// against what nvidia-smi said (references/nvidia-smi-q.xml, -L and
// nvlink -s), value by value, with a tolerance for readings that move
// between the two (test/hardware/README.md). cmd/hwcompare prints it.
package compare

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/nvmlowner"
	"github.com/gpu-node-agent/gpu-node-agent/test/hardware/nvsmi"
	"github.com/gpu-node-agent/gpu-node-agent/topology"
)

// The capture's files Load reads, relative to the capture directory.
const (
	SMIXMLFile    = "references/nvidia-smi-q.xml"
	SMIListFile   = "references/nvidia-smi-L.txt"
	SMINVLinkFile = "references/nvidia-smi-nvlink-s.txt"
	CensusFile    = "agent/census.json"
	TopologyFile  = "agent/topology.json"
	KubeletFile   = "run/kubelet.json"
	UnavailFile   = "unavailable.txt"
)

// Input is a capture's files, parsed. The optional ones are nil or empty
// with a Why saying why they are missing.
type Input struct {
	SMI    *nvsmi.Log
	Census *nvmlowner.Census

	// SMIList is `nvidia-smi -L`.
	SMIList    string
	SMIListWhy string
	// NVLinkStatus is `nvidia-smi nvlink -s`.
	NVLinkStatus    string
	NVLinkStatusWhy string

	Topology    *topology.Node
	TopologyWhy string
	Kubelet     *Kubelet
	KubeletWhy  string
}

// Kubelet is the part of the fake kubelet's report (hwkubelet's
// report.go) the comparison reads: what each resource's plugin listed.
type Kubelet struct {
	Exercised bool   `json:"exercised"`
	Error     string `json:"error"`
	Resources map[string]struct {
		Devices []struct {
			ID     string `json:"id"`
			Health string `json:"health"`
		} `json:"devices"`
	} `json:"resources"`
}

// Load reads a capture directory. It fails when nvidia-smi's XML or the
// census is missing or unreadable (there is nothing to compare then) or
// when a file that is there cannot be parsed.
func Load(dir string) (*Input, error) {
	missing, err := unavailable(dir)
	if err != nil {
		return nil, err
	}
	in := &Input{}
	b, why, err := read(dir, SMIXMLFile, missing)
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, fmt.Errorf("%s: %s", SMIXMLFile, why)
	}
	if in.SMI, err = nvsmi.Parse(b); err != nil {
		return nil, fmt.Errorf("%s: %w", SMIXMLFile, err)
	}
	if b, why, err = read(dir, CensusFile, missing); err != nil {
		return nil, err
	}
	if why != "" {
		return nil, fmt.Errorf("%s: %s", CensusFile, why)
	}
	if in.Census, err = ParseCensus(b); err != nil {
		return nil, fmt.Errorf("%s: %w", CensusFile, err)
	}

	if b, in.SMIListWhy, err = read(dir, SMIListFile, missing); err != nil {
		return nil, err
	}
	in.SMIList = string(b)
	if b, in.NVLinkStatusWhy, err = read(dir, SMINVLinkFile, missing); err != nil {
		return nil, err
	}
	in.NVLinkStatus = string(b)
	if b, in.TopologyWhy, err = read(dir, TopologyFile, missing); err != nil {
		return nil, err
	}
	if in.TopologyWhy == "" {
		if in.Topology, err = topology.ParseSnapshot(b); err != nil {
			return nil, fmt.Errorf("%s: %w", TopologyFile, err)
		}
	}
	if b, in.KubeletWhy, err = read(dir, KubeletFile, missing); err != nil {
		return nil, err
	}
	if in.KubeletWhy == "" {
		in.Kubelet = &Kubelet{}
		if err := json.Unmarshal(b, in.Kubelet); err != nil {
			return nil, fmt.Errorf("%s: %w", KubeletFile, err)
		}
	}
	return in, nil
}

// ParseCensus reads `gpu-node-agent nvml census` JSON. Numbers stay
// json.Number, so 64-bit counters keep every digit.
func ParseCensus(b []byte) (*nvmlowner.Census, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var c nvmlowner.Census
	if err := d.Decode(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

// read reads one capture file. An absent or empty file is not an error:
// why says what unavailable.txt gives as its reason, or that it is absent.
func read(dir, name string, missing map[string]string) (b []byte, why string, err error) {
	b, err = os.ReadFile(filepath.Join(dir, name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, "", err
	}
	if err == nil && len(bytes.TrimSpace(b)) > 0 {
		return b, "", nil
	}
	if r, ok := missing[name]; ok {
		return nil, "not captured: " + r, nil
	}
	if err == nil {
		return nil, "empty", nil
	}
	return nil, "absent", nil
}

// unavailable reads unavailable.txt (THING: WHY per line), if there is one.
func unavailable(dir string) (map[string]string, error) {
	b, err := os.ReadFile(filepath.Join(dir, UnavailFile))
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(dir); err != nil {
			return nil, err
		}
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if thing, why, ok := strings.Cut(line, ": "); ok {
			out[thing] = why
		}
	}
	return out, nil
}

package usage

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestReadCheckpoint reads checkpoints published from real nodes
// (testdata/checkpoint/README.md says where from).
func TestReadCheckpoint(t *testing.T) {
	tests := []struct {
		file    string
		want    []CheckpointEntry
		wantErr string
	}{
		{file: "two-pods-numa.json", want: []CheckpointEntry{
			{PodUID: "513cb897-0262-4868-826f-aa943ee45a38", Container: "app", Resource: "nvidia.com/gpu",
				DeviceIDs: []string{"GPU-77a702db-e37f-3a74-d46d-c5713f66058c"}},
			{PodUID: "94283d1b-ce5a-4797-bff8-0cf0c7143b2b", Container: "app", Resource: "nvidia.com/gpu",
				DeviceIDs: []string{"GPU-9b341c59-f96b-ba85-c137-78c3652fea65", "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841"}},
		}},
		{file: "kind-no-numa.json", want: []CheckpointEntry{
			{PodUID: "bf52b2cd-b611-4e79-86b1-280b283185c3", Container: "check", Resource: "nvidia.com/gpu", DeviceIDs: []string{"tegra"}},
		}},
		{file: "no-entries.json", want: []CheckpointEntry{}},
		{file: "legacy-list.json", want: []CheckpointEntry{
			{PodUID: "pod0002", Container: "cont_exc", Resource: "nokia.k8s.io/exclusive_caas", DeviceIDs: []string{"3", "4"}},
			{PodUID: "pod0003", Container: "cont_excl1", Resource: "nokia.k8s.io/exclusive_caas", DeviceIDs: []string{"3", "4"}},
		}},
		{file: "truncated.json", wantErr: "not a device-manager checkpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ReadCheckpoint(filepath.Join("testdata/checkpoint", tt.file))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), tt.file) {
					t.Fatalf("ReadCheckpoint() error = %v, want %q naming the file", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ReadCheckpoint() = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseCheckpointRejects(t *testing.T) {
	for name, tt := range map[string]struct{ data, want string }{
		"no Data":         {`{}`, "no Data"},
		"no pod UID":      {`{"Data":{"PodDeviceEntries":[{"ResourceName":"nvidia.com/gpu","DeviceIDs":{"0":["a"]}}]}}`, "entry 0: no PodUID"},
		"bad NUMA key":    {`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ResourceName":"r","DeviceIDs":{"x":["a"]}}]}}`, `NUMA node "x"`},
		"bad device list": {`{"Data":{"PodDeviceEntries":[{"PodUID":"u","ResourceName":"r","DeviceIDs":7}]}}`, "DeviceIDs"},
		"not JSON":        {`checkpoint`, "not a device-manager checkpoint"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseCheckpoint([]byte(tt.data)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ParseCheckpoint(%s) error = %v, want %q", tt.data, err, tt.want)
			}
		})
	}
}

func TestReadCheckpointMissing(t *testing.T) {
	_, err := ReadCheckpoint(CheckpointPath(t.TempDir()))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadCheckpoint(missing) error = %v, want fs.ErrNotExist", err)
	}
}

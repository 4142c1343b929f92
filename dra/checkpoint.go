package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/gpu-node-agent/gpu-node-agent/internal/atomicfile"
)

// CheckpointFileName is the file under PluginConfig.StateDir that holds
// the prepared claims.
const CheckpointFileName = "dra-prepared-claims.json"

// checkpointVersion is the version of the checkpoint format. A file with
// another version fails closed, like a corrupt one: guessing at a format
// this build does not know could forget a prepared claim.
const checkpointVersion = 1

// ErrCheckpointCorrupt marks a checkpoint that exists but cannot be used.
// The plugin does not start on it (fail closed): serving with an empty set
// would prepare claims twice and never unprepare the ones it forgot. An
// operator who has checked that no pod on the node uses a claim of this
// driver may delete the file.
var ErrCheckpointCorrupt = errors.New("dra checkpoint unusable")

// checkpoint is the persisted set of prepared claims, by claim UID.
//
// Format (version 1):
//
//	{"version":1,"claims":{"<uid>":{"namespace":"ns","name":"claim",
//	  "devices":[{"requests":["gpu"],"pool":"node-1","device":"gpu-0",
//	  "cdiDeviceIDs":["gpu-node-agent.io/claim=<uid>-gpu-0"]}]}}}
//
// A device made on demand adds "mig" (MadeMIG) to its entry, and MIG
// devices being made are listed in "making" (MIGPlace); both are optional,
// so a checkpoint without them reads as before.
type checkpoint struct {
	Version int                      `json:"version"`
	Claims  map[string]preparedClaim `json:"claims"`
	// Making are MIG devices being made for a claim that is not
	// checkpointed yet: each is recorded before it is made and removed
	// once its claim is checkpointed or it is destroyed again, so one that
	// a crash left behind is destroyed by the next call (MIGPlace names
	// where it is, as nothing else does before the make returns).
	Making []MIGPlace `json:"making,omitempty"`
}

// preparedClaim is what the kubelet was told for one claim; a repeated
// Prepare answers the same.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []PreparedDevice `json:"devices"`
}

// readCheckpoint reads path; an empty checkpoint if there is none,
// ErrCheckpointCorrupt (wrapped) if it cannot be trusted.
func readCheckpoint(path string) (*checkpoint, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &checkpoint{Version: checkpointVersion, Claims: map[string]preparedClaim{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrCheckpointCorrupt, path, err)
	}
	var c checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%w: decode %s: %w", ErrCheckpointCorrupt, path, err)
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("%w: %s has version %d, this agent reads version %d", ErrCheckpointCorrupt, path, c.Version, checkpointVersion)
	}
	if c.Claims == nil {
		return nil, fmt.Errorf("%w: %s has no claims map", ErrCheckpointCorrupt, path)
	}
	for uid, pc := range c.Claims {
		if uid == "" || pc.Namespace == "" || pc.Name == "" {
			return nil, fmt.Errorf("%w: %s: claim %q without UID, namespace or name", ErrCheckpointCorrupt, path, uid)
		}
		for _, d := range pc.Devices {
			if d.Device == "" || d.Pool == "" || len(d.CDIDeviceIDs) == 0 {
				return nil, fmt.Errorf("%w: %s: claim %s: device entry without name, pool or CDI IDs", ErrCheckpointCorrupt, path, uid)
			}
			if m := d.MIG; m != nil && (!m.MIGPlace.valid() || m.UUID == "") {
				return nil, fmt.Errorf("%w: %s: claim %s: device %s: made MIG device without parent, placement or UUID", ErrCheckpointCorrupt, path, uid, d.Device)
			}
		}
	}
	for _, m := range c.Making {
		if !m.valid() {
			return nil, fmt.Errorf("%w: %s: MIG device being made without parent or placement", ErrCheckpointCorrupt, path)
		}
	}
	return &c, nil
}

// writeCheckpoint replaces path atomically (atomicfile.Write, as health's
// state file is written).
func writeCheckpoint(path string, c *checkpoint) error {
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode dra checkpoint: %w", err)
	}
	if err := atomicfile.Write(path, append(data, '\n')); err != nil {
		return fmt.Errorf("dra checkpoint: %w", err)
	}
	return nil
}

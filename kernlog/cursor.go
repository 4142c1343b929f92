package kernlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpu-node-agent/gpu-node-agent/internal/atomicfile"
)

// CursorFile is the name of the cursor file in the state dir.
const CursorFile = "kernel-log-cursor.json"

// cursorVersion is the cursor file's format version.
const cursorVersion = 1

// Cursor is where reading stopped, persisted in CursorFile:
//
//	{"version":1,"bootID":"…","seq":1234}               (kmsg)
//	{"version":1,"bootID":"…","journalCursor":"s=…"}    (journal)
//	{"version":1,"bootID":"…","syslogUsec":1843308145,"syslogCount":1}  (syslog(2))
//
// The kmsg sequence number counts from 0 at every boot, so a Seq is only
// meaningful with its BootID: on the same boot records with seq <= Seq are
// skipped; on another boot the whole buffer is read. A journal cursor is
// valid across boots (the journal keeps them), but the agent reads the
// current boot only (journalctl -k implies -b), so a new boot also starts
// at the beginning of that boot's kernel messages. The syslog(2) cursor
// is a time stamp (microseconds since boot, restarting at every boot like
// the sequence numbers) and how many lines with that time stamp were
// handled; its fields are optional, so files written before it load
// unchanged (same version), and a source's fields are left alone by the
// others.
type Cursor struct {
	Version int    `json:"version"`
	BootID  string `json:"bootID,omitempty"`
	// Seq is the last kmsg record handled; HasSeq says there was one.
	Seq    uint64 `json:"seq,omitempty"`
	HasSeq bool   `json:"hasSeq,omitempty"`
	// JournalCursor is the __CURSOR of the last journal record handled.
	JournalCursor string `json:"journalCursor,omitempty"`
	// SyslogUsec is the time stamp of the last syslog(2) line handled,
	// SyslogCount how many lines with that time stamp were handled (0:
	// no syslog(2) cursor).
	SyslogUsec  uint64 `json:"syslogUsec,omitempty"`
	SyslogCount int    `json:"syslogCount,omitempty"`
}

// CursorExists says whether dir holds a cursor file (usable or not); an
// empty dir (no persistence) holds none.
func CursorExists(dir string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Lstat(filepath.Join(dir, CursorFile))
	return !errors.Is(err, fs.ErrNotExist)
}

// ErrCorruptCursor is returned (wrapped) by LoadCursor for a cursor file
// that exists but cannot be used.
var ErrCorruptCursor = errors.New("kernel log cursor file unusable")

// LoadCursor reads the cursor in dir. A missing file (or an empty dir:
// no persistence) is the zero Cursor and no error; an unreadable or
// corrupt one is the zero Cursor and an error wrapping ErrCorruptCursor;
// the Reader then reads the buffer as on a first start
// (Config.FirstStartHorizon).
func LoadCursor(dir string) (Cursor, error) {
	if dir == "" {
		return Cursor{}, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, CursorFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Cursor{}, nil
	}
	if err != nil {
		return Cursor{}, fmt.Errorf("%w: %v", ErrCorruptCursor, err)
	}
	var c Cursor
	if err := json.Unmarshal(b, &c); err != nil {
		return Cursor{}, fmt.Errorf("%w: %s: %v", ErrCorruptCursor, CursorFile, err)
	}
	if c.Version != cursorVersion {
		return Cursor{}, fmt.Errorf("%w: %s: version %d, want %d", ErrCorruptCursor, CursorFile, c.Version, cursorVersion)
	}
	return c, nil
}

// SaveCursor writes c to dir atomically (nothing without a dir).
func SaveCursor(dir string, c Cursor) error {
	if dir == "" {
		return nil
	}
	c.Version = cursorVersion
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, CursorFile), append(b, '\n'))
}

// ReadBootID reads the kernel's boot ID under hostRoot
// (proc/sys/kernel/random/boot_id, random(4)); "" if unreadable. Two empty
// boot IDs count as the same boot: without one a reboot cannot be told,
// and the kmsg sequence numbers alone decide (a record with a seq below
// the cursor's is skipped).
func ReadBootID(hostRoot string) string {
	if hostRoot == "" {
		hostRoot = "/"
	}
	b, err := os.ReadFile(filepath.Join(hostRoot, "proc/sys/kernel/random/boot_id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

package kernlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// kmsgBufSize is the read buffer for /dev/kmsg: each read(2) returns one
// record and fails with EINVAL if the buffer cannot hold it; the kernel's
// records are at most CONSOLE_EXT_LOG_MAX (8192) bytes
// (kernel/printk/printk.c).
const kmsgBufSize = 8192

// readKmsg reads <HostRoot>/dev/kmsg until ctx ends or a read fails: the
// kernel's character device, or a regular file in the same record format
// (the simulator's), followed as it grows. An open that fails with
// EPERM, EACCES, ENOENT or ENXIO wraps errUnavailable.
func (r *Reader) readKmsg(ctx context.Context, handle func(Event)) error {
	path := filepath.Join(r.cfg.HostRoot, "dev/kmsg")
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
			return fmt.Errorf("open %s: %w (%w)", path, err, errUnavailable)
		}
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat %s: %w", path, err)
	}
	r.log.Info("kernel log: reading", "source", SourceKmsg, "path", path, "regularFile", st.Mode&unix.S_IFMT == unix.S_IFREG,
		"resumeAfterSeq", r.cur.Seq, "resume", r.cur.HasSeq)
	r.metrics.setUp(SourceKmsg, true)
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		return r.followFile(ctx, fd, path, handle)
	}
	return r.readDevice(ctx, fd, path, handle)
}

// seqFilter drops records already handled and counts records lost to
// the ring buffer wrapping: the kmsg sequence numbers of one boot are
// consecutive, so a gap after the last record handled (or the cursor's)
// is records overwritten before they were read.
func (r *Reader) seqFilter(rec Record) (keep bool) {
	if r.cur.HasSeq {
		if rec.Seq <= r.cur.Seq {
			return false
		}
		if gap := rec.Seq - r.cur.Seq - 1; gap > 0 {
			r.metrics.lost.Add(float64(gap))
			r.log.Warn("kernel log records lost: overwritten before they were read", "lost", gap, "afterSeq", r.cur.Seq)
		}
	}
	return true
}

// kmsgDevice is the kernel's /dev/kmsg opened O_NONBLOCK: Read returns
// one record or an errno, Wait blocks until a record may be there (or the
// timeout passes).
type kmsgDevice interface {
	Read(buf []byte) (int, error)
	Wait(timeout time.Duration) error
}

type fdDevice int

func (d fdDevice) Read(buf []byte) (int, error) { return unix.Read(int(d), buf) }

func (d fdDevice) Wait(timeout time.Duration) error {
	fds := []unix.PollFd{{Fd: int32(d), Events: unix.POLLIN}}
	if _, err := unix.Poll(fds, int(timeout/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
		return err
	}
	return nil
}

// readDevice reads the kernel's /dev/kmsg as its ABI document
// (Documentation/ABI/testing/dev-kmsg) says: seek to the first record in
// the buffer (SEEK_SET), then records one per read(2).
func (r *Reader) readDevice(ctx context.Context, fd int, path string, handle func(Event)) error {
	if _, err := unix.Seek(fd, 0, unix.SEEK_SET); err != nil {
		return fmt.Errorf("seek %s to the first record: %w", path, err)
	}
	if err := r.readRecords(ctx, fdDevice(fd), handle); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// readRecords reads records from dev until ctx ends: EAGAIN when there is
// no new record (wait for one), EPIPE when the next record was
// overwritten (the read after it returns the oldest record still there;
// seqFilter counts what was lost), EINTR again.
func (r *Reader) readRecords(ctx context.Context, dev kmsgDevice, handle func(Event)) error {
	buf := make([]byte, kmsgBufSize)
	for ctx.Err() == nil {
		n, err := dev.Read(buf)
		switch {
		case errors.Is(err, unix.EAGAIN):
			r.saveCursor()
			if err := dev.Wait(r.cfg.Poll); err != nil {
				return fmt.Errorf("poll: %w", err)
			}
			continue
		case errors.Is(err, unix.EPIPE):
			r.log.Debug("kernel log: records overwritten before they were read (EPIPE)")
			continue
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return fmt.Errorf("read: %w", err)
		case n == 0:
			continue
		}
		rec, err := ParseKmsg(buf[:n])
		if err != nil {
			r.log.Debug("kernel log: record not parsed", "error", err)
			continue
		}
		if r.seqFilter(rec) {
			r.handleRecord(SourceKmsg, rec, handle)
		}
	}
	return nil
}

// followFile reads a regular file of kmsg records (one per line, "
// KEY=value" continuation lines after it) from its start, and follows it
// as it grows, as tail -f does. A file that shrinks was replaced: it is
// read again from its start.
func (r *Reader) followFile(ctx context.Context, fd int, path string, handle func(Event)) error {
	var (
		off     int64
		pending []byte
		chunk   = make([]byte, 64*1024)
	)
	for ctx.Err() == nil {
		n, err := unix.Pread(fd, chunk, off)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("read %s: %w", path, err)
		}
		if n > 0 {
			off += int64(n)
			pending = append(pending, chunk[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				line := pending[:i+1]
				pending = pending[i+1:]
				if len(line) == 0 || line[0] == ' ' || line[0] == '\n' {
					continue // a continuation line or an empty one
				}
				rec, err := ParseKmsg(line)
				if err != nil {
					r.log.Debug("kernel log: record not parsed", "error", err)
					continue
				}
				if r.seqFilter(rec) {
					r.handleRecord(SourceKmsg, rec, handle)
				}
			}
			pending = bytes.Clone(pending)
			continue
		}
		r.saveCursor()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err == nil && st.Size < off {
			r.log.Info("kernel log file shrank; reading it again from its start", "path", path)
			return fmt.Errorf("%s shrank from %d to %d bytes", path, off, st.Size)
		}
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.Poll):
		}
	}
	return nil
}

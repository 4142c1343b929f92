package usage

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseStat reads /proc/<pid>/stat lines as the kernel writes them
// (proc(5)): this machine's `cat /proc/self/stat`, and comm values with
// spaces and parentheses, which only the last ')' delimits.
func TestParseStat(t *testing.T) {
	tests := []struct {
		name, line string
		want       Process
		wantErr    string
	}{
		{name: "cat /proc/self/stat",
			line: "31345 (cat) R 31343 31343 20204 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 1029129 3133440 410 18446744073709551615 94078603051008 94078603070889 140726698947232 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 94078603086896 94078603088512 94079396012032 140726698953411 140726698953431 140726698953431 140726698954731 0\n",
			want: Process{PID: 31345, Comm: "cat", State: "R", StartTime: 1029129}},
		{name: "comm with parentheses (systemd's (sd-pam))",
			line: "1234 ((sd-pam)) S 1233 1233 1233 0 -1 1077936448 49 0 0 0 0 0 0 0 20 0 1 0 3412 26464256 1161 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 3 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			want: Process{PID: 1234, Comm: "(sd-pam)", State: "S", StartTime: 3412}},
		{name: "comm with a space and a ')' (a D-state worker)",
			line: "3000001 (pt main) x) D 1 3000001 3000001 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654321 3133440 410 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n",
			want: Process{PID: 3000001, Comm: "pt main) x", State: "D", StartTime: 987654321}},
		{name: "truncated", line: "31345 (cat) R 31343 31343", wantErr: "fields after comm"},
		{name: "no comm", line: "31345 cat R", wantErr: "no (comm)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.line)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseStat() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("parseStat() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestProcReaderReusedPID: a PID reused by another process (another start
// time) is read afresh, its new cgroup included; a process gone is an
// error wrapping fs.ErrNotExist.
func TestProcReaderReusedPID(t *testing.T) {
	h := newHostTree(t)
	r := newProcReader(h.root)
	h.proc(700, 1000, "python3", "S", podCgroup(uidTrain))
	p, err := r.read(700)
	if err != nil || p.Cgroup.PodUID != uidTrain || p.StartTime != 1000 {
		t.Fatalf("read(700) = %+v, %v", p, err)
	}
	r.endCycle()
	h.proc(700, 2000, "bash", "R", hostCgroup)
	p, err = r.read(700)
	if err != nil || p.Cgroup.PodUID != "" || p.StartTime != 2000 || p.Comm != "bash" {
		t.Errorf("read(700) after reuse = %+v, %v; want the new host process", p, err)
	}
	h.killProc(700)
	if _, err := r.read(700); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("read(gone) error = %v, want fs.ErrNotExist", err)
	}
	r.endCycle()
	if len(r.cache) != 0 {
		t.Errorf("cache after the process went: %v", r.cache)
	}
}

func TestHostPIDView(t *testing.T) {
	h := newHostTree(t)
	if ok, why := HostPIDView(h.root); ok || !strings.Contains(why, "hostPID") {
		t.Errorf("HostPIDView(no proc/self) = %v, %q", ok, why)
	}
	if err := os.Symlink("1", filepath.Join(h.root, "proc/self")); err != nil {
		t.Fatal(err)
	}
	if ok, why := HostPIDView(h.root); ok || !strings.Contains(why, "not in the host's PID namespace") {
		t.Errorf("HostPIDView(another namespace) = %v, %q", ok, why)
	}
	h2 := newHostTree(t)
	h2.hostPIDs()
	if ok, why := HostPIDView(h2.root); !ok {
		t.Errorf("HostPIDView(same namespace) = false, %q", why)
	}
}

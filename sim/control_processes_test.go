package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// control sends one request to n's control handler.
func control(t *testing.T, n *Node, method, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	n.ControlHandler().ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

func TestControlProcessRoutes(t *testing.T) {
	n := newProcNode(t)
	mig := migUUID(t, n, 1, 0)
	const uid = "dde1244b-5bb5-4297-b544-85f3bc0d80bf"

	// Start: a running pod's process, as the e2e does with a real pod.
	code, body := control(t, n, "POST", "/processes",
		`{"gpu":0,"memoryMiB":2048,"kind":"pod","podUID":"`+uid+`","qos":"Burstable","cgroupVersion":"v2","cgroupDriver":"systemd","runtime":"containerd","ignoreTerm":true}`)
	if code != http.StatusOK {
		t.Fatalf("POST /processes: %d %s", code, body)
	}
	var started struct{ PID uint32 }
	if err := json.Unmarshal([]byte(body), &started); err != nil || started.PID != FirstPID {
		t.Fatalf("POST /processes answered %q (%v), want {\"pid\":%d}", body, err, FirstPID)
	}
	if code, body := control(t, n, "POST", "/processes", `{"gpu":1,"mig":"`+mig+`","memoryMiB":10,"kind":"host","hostCgroup":"/system.slice/train.service","uninterruptible":true}`); code != http.StatusOK {
		t.Fatalf("POST /processes on a MIG device: %d %s", code, body)
	}
	code, body = control(t, n, "GET", "/processes", "")
	var listed []Process
	if err := json.Unmarshal([]byte(body), &listed); code != http.StatusOK || err != nil || len(listed) != 2 {
		t.Fatalf("GET /processes: %d %q (%v)", code, body, err)
	}
	if p := listed[0]; p.PodUID != uid || p.QOS != QOSBurstable || p.State != "S" || !p.IgnoreTerm || p.MemoryMiB != 2048 || !strings.HasSuffix(p.Cgroup, ".scope") {
		t.Errorf("listed %+v", p)
	}
	if p := listed[1]; p.MIG != mig || p.Kind != ProcessHost || p.State != "D" || p.Cgroup != "/system.slice/train.service" {
		t.Errorf("listed %+v", p)
	}

	pid := fmt.Sprint(FirstPID)
	for _, tc := range []struct {
		name, method, path, body string
		wantCode                 int
		wantBody                 string
	}{
		{"gpu required", "POST", "/processes", `{"memoryMiB":1,"kind":"pod"}`, 400, "gpu: required"},
		{"unknown field", "POST", "/processes", `{"gpu":0,"memoryMiB":1,"kind":"pod","pod":"x"}`, 400, `unknown field "pod"`},
		{"wrong type", "POST", "/processes", `{"gpu":0,"memoryMiB":"1GiB","kind":"pod"}`, 400, "memoryMiB: want uint64"},
		{"validation error", "POST", "/processes", `{"gpu":0,"memoryMiB":1,"kind":"pod","podUID":"nope"}`, 400, `podUID: "nope"`},
		{"trailing data", "POST", "/processes", `{"gpu":0,"memoryMiB":1,"kind":"pod"}{}`, 400, "trailing data"},
		{"sigterm ignored", "POST", "/processes/" + pid + "/signal", `{"signal":"SIGTERM"}`, 204, ""},
		{"signal by short name", "POST", "/processes/" + pid + "/signal", `{"signal":"term"}`, 204, ""},
		{"signal 0", "POST", "/processes/" + pid + "/signal", `{"signal":"0"}`, 204, ""},
		{"unknown signal", "POST", "/processes/" + pid + "/signal", `{"signal":"SIGUSR1"}`, 400, `signal: "SIGUSR1"`},
		{"bad pid", "POST", "/processes/abc/signal", `{"signal":"SIGKILL"}`, 400, `pid: "abc"`},
		{"unknown pid", "POST", "/processes/3000099/signal", `{"signal":"SIGKILL"}`, 404, "no such simulated process"},
		{"sigkill", "POST", "/processes/" + pid + "/signal", `{"signal":"SIGKILL"}`, 204, ""},
		{"gone after sigkill", "DELETE", "/processes/" + pid, "", 404, "no such simulated process"},
		{"stop the D-state process", "DELETE", "/processes/" + fmt.Sprint(FirstPID+1), "", 204, ""},
		{"leak", "POST", "/leaked-memory", `{"gpu":2,"memoryMiB":512}`, 204, ""},
		{"leak on a MIG device", "POST", "/leaked-memory", `{"gpu":1,"mig":"` + mig + `","memoryMiB":256}`, 204, ""},
		{"leak needs memoryMiB", "POST", "/leaked-memory", `{"gpu":2}`, 400, "memoryMiB: required"},
		{"leak needs gpu", "POST", "/leaked-memory", `{"memoryMiB":1}`, 400, "gpu: required"},
		{"leak needs a mig on a MIG gpu", "POST", "/leaked-memory", `{"gpu":1,"memoryMiB":1}`, 400, "mig: required"},
		{"leak too large", "POST", "/leaked-memory", `{"gpu":2,"memoryMiB":100000}`, 400, "is more than the 81600 MiB free on gpu 2"},
		{"leaks listed", "GET", "/leaked-memory", "", 200, `"memoryMiB": 512`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := control(t, n, tc.method, tc.path, tc.body)
			if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
				t.Fatalf("%s %s %s: %d %q, want %d with %q", tc.method, tc.path, tc.body, code, body, tc.wantCode, tc.wantBody)
			}
		})
	}
	if ps := n.Processes(); len(ps) != 0 {
		t.Errorf("processes left: %+v", ps)
	}
	if _, m2 := memOf(t, n, 2); m2.Used != 512<<20 {
		t.Errorf("gpu 2 used %d after a 512 MiB leak", m2.Used)
	}
}

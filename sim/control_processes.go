package sim

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
)

// The control API's process routes (ControlHandler lists them).

// processRequest is the body of POST /processes: a ProcessSpec whose gpu
// must be given (0 is a GPU).
type processRequest struct {
	ProcessSpec
	GPU *int `json:"gpu"`
}

// signalRequest is the body of POST /processes/{pid}/signal.
type signalRequest struct {
	// Signal is a name (SIGTERM or TERM, SIGKILL, SIGINT, SIGHUP,
	// SIGQUIT) or "0" (only check that the process runs).
	Signal string `json:"signal"`
}

// leakRequest is the body of POST /leaked-memory.
type leakRequest struct {
	GPU       *int    `json:"gpu"`
	MIG       string  `json:"mig"`
	MemoryMiB *uint64 `json:"memoryMiB"`
}

var signalNames = map[string]syscall.Signal{
	"0": 0, "SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL,
}

func (n *Node) processRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /processes", n.handleStartProcess)
	mux.HandleFunc("GET /processes", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, n.Processes()) })
	mux.HandleFunc("DELETE /processes/{pid}", n.handleStopProcess)
	mux.HandleFunc("POST /processes/{pid}/signal", n.handleSignalProcess)
	mux.HandleFunc("POST /processes/{pid}/utilization", n.handleProcessUtilization)
	mux.HandleFunc("POST /leaked-memory", n.handleLeakedMemory)
	mux.HandleFunc("GET /leaked-memory", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, n.Leaks()) })
}

func (n *Node) handleStartProcess(w http.ResponseWriter, r *http.Request) {
	var req processRequest
	if err := decodeStrict(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if req.GPU == nil {
		httpError(w, http.StatusBadRequest, errors.New("gpu: required"))
		return
	}
	spec := req.ProcessSpec
	spec.GPU = *req.GPU
	pid, err := n.StartProcess(spec)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]uint32{"pid": pid})
}

func (n *Node) handleStopProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPID(r)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if err := n.StopProcess(pid); err != nil {
		httpError(w, processErrorCode(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (n *Node) handleSignalProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPID(r)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	var req signalRequest
	if err := decodeStrict(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	name := strings.ToUpper(req.Signal)
	if name != "0" && !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig, ok := signalNames[name]
	if !ok {
		httpError(w, http.StatusBadRequest, fmt.Errorf("signal: %q: want SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT or 0", req.Signal))
		return
	}
	if err := n.SignalProcess(pid, sig); err != nil {
		httpError(w, processErrorCode(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (n *Node) handleProcessUtilization(w http.ResponseWriter, r *http.Request) {
	pid, err := pathPID(r)
	if err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	var req ProcessUtilization
	if err := decodeStrict(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if err := n.SetProcessUtilization(pid, req); err != nil {
		httpError(w, processErrorCode(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (n *Node) handleLeakedMemory(w http.ResponseWriter, r *http.Request) {
	var req leakRequest
	if err := decodeStrict(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	switch {
	case req.GPU == nil:
		httpError(w, http.StatusBadRequest, errors.New("gpu: required"))
		return
	case req.MemoryMiB == nil:
		httpError(w, http.StatusBadRequest, errors.New("memoryMiB: required (0 frees the leak)"))
		return
	}
	if err := n.SetLeakedMemory(*req.GPU, req.MIG, *req.MemoryMiB); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pathPID is the {pid} of the request's path.
func pathPID(r *http.Request) (uint32, error) {
	s := r.PathValue("pid")
	pid, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("pid: %q: want a process ID", s)
	}
	return uint32(pid), nil
}

// processErrorCode is 404 for a process that is not running, 400 for
// anything else.
func processErrorCode(err error) int {
	if errors.Is(err, syscall.ESRCH) {
		return http.StatusNotFound
	}
	return http.StatusBadRequest
}

package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
)

// Fault is a fault to inject into (POST /faults) or clear from (DELETE
// /faults) a simulated node. Which fields matter depends on Kind.
type Fault struct {
	// Kind names the fault, e.g. "xid", "gpu-lost", "nvlink-down".
	Kind string `json:"kind"`
	// GPU is the index of the GPU the fault concerns, in the order of the
	// spec the node was built from (NVML's index while no GPU is
	// gpu-missing). -1, for kind "xid" only, raises the event without a
	// device, as NVML does for an error it cannot attribute.
	GPU int `json:"gpu"`
	// XID is the XID error code for "xid" faults, the SXid number for
	// "sxid" faults.
	XID uint64 `json:"xid,omitempty"`
	// NonFatal makes an "sxid" fault a non-fatal SXid (default fatal).
	NonFatal bool `json:"nonFatal,omitempty"`
	// Link is the NVLink number for link faults.
	Link int `json:"link,omitempty"`
	// NIC is the RDMA device name for NIC faults.
	NIC string `json:"nic,omitempty"`
	// Period is how often a "nic-flap" port goes down and up, or a
	// "nic-errors" port's error counters rise, as a Go duration (default
	// "1s").
	Period string `json:"period,omitempty"`
	// Count is how many errors a "nic-errors" port counts every Period
	// (default 100).
	Count int `json:"count,omitempty"`
	// MIG is the UUID of the MIG device a fault is confined to: its event
	// carries the device's GPU and compute instance IDs.
	MIG string `json:"mig,omitempty"`
	// GI is the GPU instance ID an "xid" or "ecc-dbe" event is attributed
	// to without a compute instance (ComputeInstanceId 0xFFFFFFFF).
	GI *uint32 `json:"gi,omitempty"`
	// PCIeGen and PCIeWidth are the link a "pcie-degraded" GPU trains at
	// (0: the maximum; both 0: one generation down at half width).
	PCIeGen   int `json:"pcieGen,omitempty"`
	PCIeWidth int `json:"pcieWidth,omitempty"`
	// Reason is the clocks event reason of a "throttle" fault, by
	// nvmlapi.ClocksEventReasons name (default hw-slowdown).
	Reason string `json:"reason,omitempty"`
	// DriverVersion is what an "old-driver" node reports (default
	// DefaultOldDriver).
	DriverVersion string `json:"driverVersion,omitempty"`
	// ExitCode is what the preflight's command exits with under a
	// "command-fail" fault (default 1); Seconds how late it starts under
	// "command-slow" (default DefaultCommandDelay).
	ExitCode int `json:"exitCode,omitempty"`
	Seconds  int `json:"seconds,omitempty"`
	// Call is the NVML call a "mig-create-fails" fault makes fail:
	// CreateGpuInstanceWithPlacement (default) or CreateComputeInstance;
	// Ret what it answers, by nvml.h name without "NVML_" (default
	// ERROR_INSUFFICIENT_RESOURCES).
	Call string `json:"call,omitempty"`
	Ret  string `json:"ret,omitempty"`
}

// migRequest is the body of POST /mig.
type migRequest struct {
	GPU      *int     `json:"gpu"`
	Profiles []string `json:"profiles"`
	// MIGMode, when given, sets MIG mode: true with no profiles is MIG on
	// with no instance (EnableMIG); false needs no profiles. Without it,
	// an empty list turns MIG off.
	MIGMode *bool `json:"migMode,omitempty"`
}

// maxControlBody bounds request bodies; real ones are a few hundred bytes.
const maxControlBody = 1 << 16

// ControlHandler serves the simulator's control API:
//
//	POST   /mig     {"gpu":1,"profiles":["3g.40gb","3g.40gb"]}  (empty list: MIG off)
//	POST   /mig     {"gpu":1,"migMode":true,"profiles":[]}      (MIG on, no instance)
//	POST   /faults  a Fault
//	DELETE /faults  a Fault
//	GET    /state   the current layout as NVML lists it (topology.Node JSON)
//	GET    /calls   NVML calls made so far, by method ({"GetUUID":12,...})
//	POST   /processes               a ProcessSpec; answers {"pid":3000000}
//	GET    /processes               the running processes (Process JSON, by PID)
//	DELETE /processes/{pid}         the process exits (StopProcess)
//	POST   /processes/{pid}/signal  {"signal":"SIGTERM"} (SignalProcess)
//	POST   /processes/{pid}/utilization  {"smUtil":40,"memUtil":10} from now on (SetProcessUtilization)
//	POST   /leaked-memory           {"gpu":0,"mig":"MIG-...","memoryMiB":2048} (SetLeakedMemory)
//	GET    /leaked-memory           the leaks ([{"gpu":0,"memoryMiB":2048}])
//
// Bad requests get 400 with a message naming the offending field; a PID
// that is not running gets 404.
func (n *Node) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /mig", n.handleMIG)
	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) { n.handleFault(w, r, n.injectFault) })
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) { n.handleFault(w, r, n.clearFault) })
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, n.Spec()) })
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, n.NVMLCalls()) })
	n.processRoutes(mux)
	return mux
}

func (n *Node) handleMIG(w http.ResponseWriter, r *http.Request) {
	var req migRequest
	if err := decodeStrict(r, &req); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if req.GPU == nil {
		httpError(w, http.StatusBadRequest, errors.New("gpu: required"))
		return
	}
	if err := n.checkGPU(*req.GPU); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	on := len(req.Profiles) > 0
	if req.MIGMode != nil {
		if !*req.MIGMode && on {
			httpError(w, http.StatusBadRequest, errors.New("migMode: false, but profiles are given (MIG devices need MIG mode on)"))
			return
		}
		on = *req.MIGMode
	}
	if err := n.setMIG(*req.GPU, on, req.Profiles); err != nil {
		httpError(w, http.StatusBadRequest, fmt.Errorf("profiles: %w", err))
		return
	}
	writeJSON(w, http.StatusOK, n.gpuSpec(*req.GPU))
}

func (n *Node) handleFault(w http.ResponseWriter, r *http.Request, apply func(Fault) error) {
	var f Fault
	if err := decodeStrict(r, &f); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	if f.Kind == "" {
		httpError(w, http.StatusBadRequest, errors.New("kind: required"))
		return
	}
	if err := apply(f); err != nil {
		httpError(w, http.StatusBadRequest, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (n *Node) checkGPU(i int) error {
	if i < 0 || i >= len(n.gpus) {
		return fmt.Errorf("gpu: no such gpu %d (node has %d)", i, len(n.gpus))
	}
	return nil
}

// decodeStrict decodes one JSON object, refusing unknown fields and
// trailing data, and names the field at fault when a value has the wrong
// type.
func decodeStrict(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxControlBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fmt.Errorf("%s: want %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
		}
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if dec.More() {
		return errors.New("invalid JSON body: trailing data after the object")
	}
	return nil
}

func httpError(w http.ResponseWriter, code int, err error) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, err.Error())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// ServeControl serves h on addr until ctx is done. addr must be a loopback
// address ("127.0.0.1:7777", "[::1]:7777", "localhost:7777"): the control
// API changes the node's devices and has no authentication, so it never
// listens on a network other hosts can reach.
func ServeControl(ctx context.Context, addr string, h http.Handler, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := checkLoopback(addr); err != nil {
		return fmt.Errorf("simulator control endpoint: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("simulator control endpoint: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	// Cancelling on return also ends the shutdown goroutine when Serve
	// fails on its own.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	log.Info("simulator control endpoint listening", "addr", ln.Addr().String())
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		<-done
		return nil
	}
	return fmt.Errorf("simulator control endpoint: %w", err)
}

// checkLoopback refuses any address whose host is not a loopback IP or
// "localhost"; an empty host (":7777") would listen on every interface.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q: refusing to listen on a non-loopback address", addr)
	}
	return nil
}

// Command hwkubelet is the hardware check kit's stand-in for the kubelet
// (test/hardware/hw-check.sh): it serves the device-plugin registration
// socket, dials every plugin back, makes the calls a kubelet makes when a
// pod asks for a resource and writes what it saw as one JSON file. It also
// does the few things the kit cannot count on the GPU machine to have
// (an HTTP GET without curl, a free port, gunzip). It is built with
// CGO_ENABLED=0, so it runs on any glibc, and links no k8s.io/kubernetes.
package main

import (
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/devicemanager"
)

const usage = `usage: hwkubelet serve -dir DIR -out FILE [-wait D] [-settle D] [-exit]
       hwkubelet get URL OUTFILE
       hwkubelet freeport
       hwkubelet gunzip IN OUT`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return runServe(args[1:], stderr)
	case "get":
		return runGet(args[1:], stdout, stderr)
	case "freeport":
		return runFreePort(stdout, stderr)
	case "gunzip":
		return runGunzip(args[1:], stderr)
	}
	fmt.Fprintf(stderr, "hwkubelet: unknown command %q\n%s\n", args[0], usage)
	return 2
}

// runServe is "serve": the fake kubelet. Exit status: 0 when at least one
// plugin registered and was exercised, 3 when none registered within
// -wait, 2 on a bad command line, 1 when the socket cannot be served.
func runServe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("hwkubelet serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "device-plugin directory: kubelet.sock is served there")
	out := fs.String("out", "", "JSON report `FILE`")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for the first plugin to register and list its devices")
	settle := fs.Duration("settle", 2*time.Second, "how long the plugin table must stay unchanged (more resources registering) before the calls are made")
	exit := fs.Bool("exit", false, "exit once the calls are made (default: serve until SIGTERM, then write the report again)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var srv *registrationServer
	k, err := devicemanager.Start(*dir, newServerFunc(log, &srv))
	if err != nil {
		log.Error("cannot serve the registration socket", "err", err)
		return 1
	}
	defer k.Stop()
	rep := &Report{Dir: *dir, Started: time.Now()}
	var calls map[string]*Resource
	write := func() {
		rep.Registrations = srv.Registrations()
		rep.Resources = resourcesOf(k.Plugins(), calls)
		if err := writeReport(*out, rep); err != nil {
			log.Error("cannot write the report", "err", err)
		}
	}

	wctx, cancel := context.WithTimeout(ctx, *wait)
	_, err = k.WaitFor(wctx, func(p map[string]devicemanager.Plugin) bool {
		return len(devicemanager.Connected(p, k.Generation())) > 0
	})
	cancel()
	if err != nil {
		rep.Error = fmt.Sprintf("no device plugin registered and listed its devices within %s", *wait)
		if ctx.Err() != nil {
			rep.Error = "stopped before any device plugin registered"
		}
		log.Warn(rep.Error)
		write()
		return 3
	}
	settled(ctx, k, srv, *settle)
	calls = exercise(ctx, k, log)
	rep.Exercise = true
	write()
	if *exit {
		return 0
	}
	<-ctx.Done()
	write()
	return 0
}

// settled returns once the plugin table and the registrations stayed the
// same for d: a plugin serving several resources registers them one
// after another.
func settled(ctx context.Context, k *devicemanager.Kubelet, srv *registrationServer, d time.Duration) {
	const tick = 100 * time.Millisecond
	last, since := "", time.Now()
	for ctx.Err() == nil {
		sig := signature(k.Plugins(), len(srv.Registrations()))
		if sig != last {
			last, since = sig, time.Now()
		} else if time.Since(since) >= d {
			return
		}
		time.Sleep(tick)
	}
}

func signature(plugins map[string]devicemanager.Plugin, regs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", regs)
	for _, name := range slices.Sorted(maps.Keys(plugins)) {
		p := plugins[name]
		fmt.Fprintf(&b, ";%s:%t:%d:%d", name, p.Connected, p.Updates, len(p.Devices))
	}
	return b.String()
}

// runGet is "get URL OUTFILE", curl -sS -o OUTFILE -w '%{http_code}' for a
// machine without curl: the body goes to OUTFILE whatever the status, the
// status code to stdout ("000" when there was no response, exit 1).
func runGet(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(args[0])
	if err != nil {
		fmt.Fprintf(stderr, "hwkubelet get: %v\n", err)
		fmt.Fprint(stdout, "000")
		return 1
	}
	defer resp.Body.Close()
	f, err := os.Create(args[1])
	if err != nil {
		fmt.Fprintf(stderr, "hwkubelet get: %v\n", err)
		return 1
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	fmt.Fprintf(stdout, "%03d", resp.StatusCode)
	if err != nil {
		fmt.Fprintf(stderr, "hwkubelet get: read body: %v\n", err)
		return 1
	}
	return 0
}

// runFreePort prints a loopback TCP port that was free a moment ago.
func runFreePort(stdout, stderr io.Writer) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(stderr, "hwkubelet freeport: %v\n", err)
		return 1
	}
	defer l.Close()
	fmt.Fprintln(stdout, l.Addr().(*net.TCPAddr).Port)
	return 0
}

// runGunzip is "gunzip IN OUT": the kit's agent binaries travel
// compressed (the device machine takes 64 MiB of files) and the machine
// may have no gzip. OUT is made executable.
func runGunzip(args []string, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if err := gunzip(args[0], args[1]); err != nil {
		fmt.Fprintf(stderr, "hwkubelet gunzip: %v\n", err)
		os.Remove(args[1])
		return 1
	}
	return 0
}

func gunzip(in, out string) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	w, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, zr); err != nil {
		w.Close()
		return fmt.Errorf("%s: %w", in, err)
	}
	return errors.Join(zr.Close(), w.Close())
}

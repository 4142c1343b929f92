// Package testutil holds what many packages' tests need: waiting for a
// condition, a temporary directory short enough for unix sockets, and a
// fault posted to a running simulator's control API. The product never
// imports it.
package testutil

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// DefaultWait bounds WaitFor. It only ends a broken run; it asserts
// nothing about speed.
const DefaultWait = 60 * time.Second

// WaitFor polls cond until it holds, failing the test naming what once
// DefaultWait has passed.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitForWithin(t, DefaultWait, what, cond)
}

// WaitForWithin is WaitFor with its own bound. It polls every millisecond
// at first and backs off to every 20 ms, so that a fast change is seen at
// once and a slow one (a condition that asks an API server) costs little.
func WaitForWithin(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(pause)
		pause = min(2*pause, 20*time.Millisecond)
	}
}

// ShortTempDir is a temporary directory removed when the test ends, under
// os.TempDir() with a short name: t.TempDir() paths with long test names
// exceed the 108-byte limit of a unix socket path.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gna")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// SimFault sends method (POST to inject, DELETE to clear) with the JSON
// fault body to the /faults endpoint of a simulator control API listening
// on addr, failing the test unless it answers 2xx.
func SimFault(t testing.TB, addr, method, body string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+"/faults", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s /faults %s: %s %s", method, body, resp.Status, b)
	}
}

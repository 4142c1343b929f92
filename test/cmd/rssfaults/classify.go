package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// faultAroundKiB is the kernel's default fault-around window
// (/sys/kernel/debug/fault_around_bytes): what one fault on a file
// mapping brings in at most.
const faultAroundKiB = 64

type section struct {
	name       string
	start, end uint64
}

// sample is one page fault: the faulting address and the call chain,
// innermost frame first.
type sample struct {
	addr   uint64
	frames []string
}

// parseScript reads `perf script -F addr,ip,sym` of call-graph samples:
// a line with the address, then one line per frame, a blank line between
// samples.
func parseScript(b []byte) []sample {
	var out []sample
	var cur *sample
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			cur = nil
			continue
		}
		if cur == nil {
			addr, err := strconv.ParseUint(fields[0], 16, 64)
			if err != nil {
				continue
			}
			out = append(out, sample{addr: addr})
			cur = &out[len(out)-1]
			continue
		}
		if len(fields) >= 2 {
			cur.frames = append(cur.frames, fields[1])
		}
	}
	return out
}

// The phases a fault is charged to, in the order they are printed.
const (
	phaseStart  = "runtime start (before any init: schedinit, itabsinit, moduledataverify)"
	phaseInit   = "package init (every linked package's init, before main)"
	phaseAgent  = "the agent (main and the goroutines it starts)"
	phaseStack  = "goroutine stack growth (newstack, copystack: each frame's stack maps)"
	phaseOthers = "other (GC, scheduler, library goroutines)"
)

var phases = []string{phaseStart, phaseInit, phaseAgent, phaseStack, phaseOthers}

var initFunc = regexp.MustCompile(`\.init(\.\d+)?$`)

type report struct {
	sections []string
	total    int
	// faults[phase][section]
	faults map[string]map[string]int
	// initPkgs counts package-init faults by the package whose init ran;
	// agentFuncs counts the agent's by its innermost own function.
	initPkgs, agentFuncs map[string]int
}

func classify(samples []sample, secs []section, module string) report {
	r := report{
		faults:     map[string]map[string]int{},
		initPkgs:   map[string]int{},
		agentFuncs: map[string]int{},
	}
	for _, s := range secs {
		r.sections = append(r.sections, s.name)
	}
	for _, p := range phases {
		r.faults[p] = map[string]int{}
	}
	for _, s := range samples {
		sec := sectionOf(s.addr, secs)
		if sec == "" {
			continue
		}
		r.total++
		phase := phaseOf(s.frames, module)
		r.faults[phase][sec]++
		switch phase {
		case phaseInit:
			pkg := initPackage(s.frames)
			if pkg == "" {
				// A leaf without a frame pointer (assembly such as
				// memmove) hides its caller from perf's unwinding.
				pkg = "(the init function is not on the unwound stack)"
			}
			r.initPkgs[pkg]++
		case phaseAgent:
			r.agentFuncs[ownFrame(s.frames, module)]++
		}
	}
	return r
}

func sectionOf(addr uint64, secs []section) string {
	for _, s := range secs {
		if addr >= s.start && addr < s.end {
			return s.name
		}
	}
	return ""
}

func phaseOf(frames []string, module string) string {
	has := func(name string) bool {
		for _, f := range frames {
			if f == name {
				return true
			}
		}
		return false
	}
	switch {
	case has("runtime.newstack") || has("runtime.copystack"):
		return phaseStack
	case has("runtime.rt0_go.abi0") && !has("runtime.main"):
		return phaseStart
	case !has("main.main") && (has("runtime.doInit1") || initPackage(frames) != ""):
		return phaseInit
	case ownFrame(frames, module) != "":
		return phaseAgent
	}
	return phaseOthers
}

// initPackage is the package of the outermost init function on the
// chain, "" when there is none.
func initPackage(frames []string) string {
	for i := len(frames) - 1; i >= 0; i-- {
		if initFunc.MatchString(frames[i]) {
			return packageOf(frames[i])
		}
	}
	return ""
}

// ownFrame is the innermost frame of the agent's own code (its module
// or package main), "" when there is none.
func ownFrame(frames []string, module string) string {
	for _, f := range frames {
		if strings.HasPrefix(f, module+"/") || strings.HasPrefix(f, "main.") {
			return f
		}
	}
	return ""
}

// packageOf is the import path of a Go symbol such as
// k8s.io/apimachinery/pkg/runtime.(*Scheme).AddKnownTypes.
func packageOf(sym string) string {
	slash := strings.LastIndex(sym, "/")
	dot := strings.Index(sym[slash+1:], ".")
	if dot < 0 {
		return sym
	}
	return sym[:slash+1+dot]
}

func (r report) print(w io.Writer, d time.Duration, top int) {
	fmt.Fprintf(w, "%d page faults on the binary's file-backed sections in %s (each maps up to %d KiB: at most %.1f MiB)\n\n",
		r.total, d, faultAroundKiB, float64(r.total*faultAroundKiB)/1024)
	used := map[string]bool{}
	for _, p := range phases {
		for s, n := range r.faults[p] {
			if n > 0 {
				used[s] = true
			}
		}
	}
	var cols []string
	for _, s := range r.sections {
		if used[s] {
			cols = append(cols, s)
		}
	}
	fmt.Fprintf(w, "| faults by what ran | %s | total |\n|---|%s---|\n", strings.Join(cols, " | "), strings.Repeat("---|", len(cols)))
	for _, p := range phases {
		sum := 0
		var cells []string
		for _, s := range cols {
			cells = append(cells, strconv.Itoa(r.faults[p][s]))
			sum += r.faults[p][s]
		}
		fmt.Fprintf(w, "| %s | %s | %d |\n", p, strings.Join(cells, " | "), sum)
	}
	printTop(w, "package init, by the package whose init ran", r.initPkgs, top)
	printTop(w, "the agent, by its innermost own function", r.agentFuncs, top)
}

func printTop(w io.Writer, title string, m map[string]int, top int) {
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range m {
		all = append(all, kv{k, n})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].n != all[j].n {
			return all[i].n > all[j].n
		}
		return all[i].k < all[j].k
	})
	fmt.Fprintf(w, "\n%s (%d of %d):\n", title, min(top, len(all)), len(all))
	for i, e := range all {
		if i == top {
			break
		}
		fmt.Fprintf(w, "  %4d  %s\n", e.n, e.k)
	}
}

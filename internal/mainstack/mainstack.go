// Package mainstack grows the main goroutine's stack once, among the first
// package initialisations, to the size the agent's start needs anyway.
// Import it for its side effect, from package main only.
//
// A goroutine starts on a 2 KiB stack and doubles it whenever a call does
// not fit. The main goroutine runs every linked package's init and then
// the agent's start, and without this package it doubled five times, to
// 64 KiB (a uprobe on runtime.copystack, README "Where the product's idle
// real-mode RSS goes"). Each growth copies the stack and, to move the
// pointers in it, reads the SP delta and stack maps of every frame then on
// it from .gopclntab. Those entries are spread over the table, and the
// first read of each maps a 64 KiB window of the binary (the kernel's
// fault-around): about six windows, 0.3-0.4 MB of the idle agent's resident
// set that stays, since the deep frames of init are gone by the time a GC
// scans the stack. Grown here, the stack is copied once, with four frames
// on it.
//
// This works only if the package initialises before the deep inits. Go
// initialises, among the packages whose imports are done, the first by
// import path; this package imports nothing, so it comes after a few of
// the standard library's and before any other (TestMainStackInitFirst in
// cmd/gpu-node-agent).
package mainstack

// frame is the size of grow's frame. From a stack of 2 KiB with under
// 1 KiB in use, runtime.newstack doubles until the frame fits: to 64 KiB,
// what the start reaches anyway.
const frame = 40 << 10

func init() { _ = grow(false) }

// grow has a frame of frame bytes, which its prologue checks against the
// stack before it runs. Called with use false it never zeroes or touches
// the array, so the growth faults in no page of the new stack.
//
//go:noinline
func grow(use bool) byte {
	if use {
		var buf [frame]byte
		return first(&buf)
	}
	return 0
}

//go:noinline
func first(b *[frame]byte) byte { return b[0] }

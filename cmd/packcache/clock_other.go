//go:build !linux

package main

// cpuClock is the wall clock where the command does not read a thread's
// CPU time (see clock_linux.go).
var cpuClock = wallClock

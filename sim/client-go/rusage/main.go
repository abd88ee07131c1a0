// cocoon-sim-rusage CMD [ARG...]: runs CMD with this process's stdio, waits for it, writes
// "<user µs> <system µs> <wall µs>\n" (getrusage of the child, from wait4) to file descriptor 3
// and exits with CMD's status. Used by bench/sim-call.ts: Node cannot read a child's rusage,
// and /proc's clock ticks (10 ms) are too coarse for a call of a few milliseconds.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cocoon-sim-rusage CMD [ARG...]")
		os.Exit(2)
	}
	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if cmd.ProcessState == nil {
		fmt.Fprintln(os.Stderr, "cocoon-sim-rusage:", err)
		os.Exit(127)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	us := func(t syscall.Timeval) int64 { return t.Sec*1_000_000 + t.Usec }
	out := os.NewFile(3, "rusage")
	fmt.Fprintf(out, "%d %d %d\n", us(ru.Utime), us(ru.Stime), wall.Microseconds())
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(ws.ExitStatus())
}

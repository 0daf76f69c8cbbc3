// Command kvm-guest-console runs a command (the guest's console shell) with
// SIGINT and SIGQUIT at their default action, so that ^C and ^\ typed on
// the console reach the shell's foreground job.
//
// /init runs the console shell in the background, so that PID 1 can sit in
// `wait` and act on the power requests busybox's poweroff, halt and reboot
// send it. A non-interactive shell starts a background command with SIGINT
// and SIGQUIT ignored, an ignored signal stays ignored across exec, and a
// shell that starts with one ignored may not handle it again (ash marks it
// "hard ignored"): the console's ^C did nothing. No busybox applet resets a
// signal's disposition, hence this program: a signal that has a handler
// (here Go's, from Notify) is reset to its default by exec.
//
// Usage: kvm-guest-console COMMAND [ARG...]
package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kvm-guest-console COMMAND [ARG...]")
		os.Exit(2)
	}
	path, err := exec.LookPath(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvm-guest-console: %v\n", err)
		os.Exit(127)
	}
	// Notify replaces SIG_IGN with Go's handler; exec then resets every
	// handled signal to SIG_DFL. The channel is never read.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGQUIT)
	err = syscall.Exec(path, os.Args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "kvm-guest-console: exec %s: %v\n", path, err)
	os.Exit(126)
}

// Command pause is a stand-in CRI sandbox ("pause") process: it does
// nothing but wait for SIGTERM or SIGINT and then exits with status 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	os.Exit(0)
}

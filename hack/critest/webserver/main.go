// Command webserver is the web server of the CRI conformance suite's
// nginx, httpd and host-network nginx stand-in images: it answers 200 on
// every path, writes its pid where nginx writes its own, and logs one line
// naming itself when it listens (the suite reads that line from the
// container's log).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	listen := flag.String("listen", ":80", "address to listen on")
	pidFile := flag.String("pidfile", "", "file to write the pid to, if set")
	name := flag.String("name", "webserver", "name logged at start")
	// Positional arguments are ignored: the nginx stand-in carries "master
	// process" there so that /proc/1/cmdline reads as nginx's does.
	flag.Parse()
	if err := run(*listen, *pidFile, *name); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *name, err)
		os.Exit(1)
	}
}

func run(listen, pidFile, name string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if pidFile != "" {
		if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "%s: listening on %s\n", name, ln.Addr())
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "<html><body>%s</body></html>\n", name)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	// Pid 1 of a container gets no default signal action: stop on TERM.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}

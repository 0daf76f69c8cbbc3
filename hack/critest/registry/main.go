// Command critest-registry is the image registry of the CRI conformance
// suite harness: it builds every image critest pulls from a busybox-static
// binary and small programs of this module, serves them from memory on a
// loopback port with go-containerregistry's registry, and writes the
// address it listens on to a file once every image is in. It runs until
// SIGTERM or SIGINT.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	var b bins
	listen := flag.String("listen", "127.0.0.1:0", "loopback address to serve on")
	addrFile := flag.String("addr-file", "", "file the address is written to once the images are in (required)")
	flag.StringVar(&b.busybox, "busybox", "/bin/busybox", "busybox-static binary of the base layer")
	flag.StringVar(&b.procps, "procps", "", "the procps program: pgrep and ipcs (required)")
	flag.StringVar(&b.webserver, "webserver", "", "the webserver program (required)")
	flag.StringVar(&b.nonewprivs, "nonewprivs", "", "the nonewprivs program (required)")
	flag.StringVar(&b.pause, "pause", "", "the sandbox (pause) program (required)")
	flag.Parse()
	if err := run(*listen, *addrFile, b); err != nil {
		fmt.Fprintf(os.Stderr, "critest-registry: %v\n", err)
		os.Exit(1)
	}
}

func run(listen, addrFile string, b bins) error {
	if addrFile == "" || b.procps == "" || b.webserver == "" || b.nonewprivs == "" || b.pause == "" {
		return errors.New("-addr-file, -procps, -webserver, -nonewprivs and -pause are required")
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("-listen %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("-listen %q: not a loopback address", listen)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	var pulls atomic.Int64
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
				pulls.Add(1)
			}
			reg.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 30 * time.Second,
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	addr := ln.Addr().String()
	start := time.Now()
	n, err := pushAll(addr, b)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "critest-registry: %d images in %v, serving on %s\n", n, time.Since(start).Round(time.Millisecond), addr)
	if err = writeAtomic(addrFile, addr+"\n"); err != nil {
		return err
	}
	err = <-served
	fmt.Fprintf(os.Stderr, "critest-registry: served %d manifest GETs\n", pulls.Load())
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// writeAtomic writes content to path through a temporary file and a rename,
// so a reader polling for path never sees it half written.
func writeAtomic(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

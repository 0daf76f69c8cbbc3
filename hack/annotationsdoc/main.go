// Command annotationsdoc writes the annotation reference,
// docs/annotations.md, from package annotations (run by
// `go generate ./annotations`).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

func main() {
	out := flag.String("o", "", "file to write (default: standard output)")
	flag.Parse()
	var b bytes.Buffer
	if err := annotations.WriteReference(&b); err != nil {
		fmt.Fprintln(os.Stderr, "annotationsdoc:", err)
		os.Exit(1)
	}
	if *out == "" {
		_, _ = os.Stdout.Write(b.Bytes())
		return
	}
	if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "annotationsdoc:", err)
		os.Exit(1)
	}
}

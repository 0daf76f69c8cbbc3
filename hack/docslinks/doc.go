// Package docslinks checks the repository's Markdown: every relative link
// in a .md file must name a file or directory that exists, a link to a
// heading (#anchor) must name a heading of that page, and
// docs/annotations.md must have a section for every kvm.containerd.io/*
// annotation key the Go code names, and none for a key it no longer
// names. Its tests run with every `go test ./...`, so a page that moves,
// a heading that is renamed or an annotation that is added fails the unit
// tier instead of leaving a dead link or a gap for a reader.
package docslinks

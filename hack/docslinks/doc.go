// Package docslinks checks the repository's Markdown against the tree:
// every relative link in a .md file must name a file or directory that
// exists, and a link to a heading (#anchor) a heading of that page;
// docs/annotations.md must have a section for every kvm.containerd.io/*
// annotation key the Go code names, and none for a key it no longer
// names; the package map in docs/README.md must have a row for every
// directory that holds Go files. Its tests run with every `go test ./...`,
// so a page that moves, a heading that is renamed, or an annotation or a
// package that is added fails the unit tier instead of leaving a dead
// link or a gap for a reader.
package docslinks

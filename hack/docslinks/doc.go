// Package docslinks checks the repository's Markdown: every relative link
// in a .md file must name a file or directory that exists, and a link to a
// heading (#anchor) must name a heading of that page. Its test runs with
// every `go test ./...`, so a page that moves or a heading that is renamed
// fails the unit tier instead of leaving a dead link for a reader.
package docslinks

#!/usr/bin/env bash
# Build the CRI conformance suite (critest, a compiled ginkgo test binary)
# and crictl from sigs.k8s.io/cri-tools at one pinned version, from the Go
# module proxy, into a cache directory outside the repository. A second run
# with the same version does nothing; changing CRI_TOOLS_VERSION builds into
# a new directory.
#
# cmd/critest holds only a _test.go file, so it is built with `go test -c`.
# The module is copied out of the (read-only) module cache and built as the
# main module, with its own go.mod and go.sum: the same dependency versions
# as the release.
#
# Environment:
#   CRI_TOOLS_VERSION  cri-tools version (default v1.34.0)
#   CRI_TOOLS_CACHE    cache root (default /var/cache/kvm-shim); binaries go
#                      to $CRI_TOOLS_CACHE/cri-tools-$CRI_TOOLS_VERSION/bin
#
# Prints the bin directory on stdout.
set -euo pipefail

CRI_TOOLS_VERSION=${CRI_TOOLS_VERSION:-v1.34.0}
CRI_TOOLS_CACHE=${CRI_TOOLS_CACHE:-/var/cache/kvm-shim}
BIN=$CRI_TOOLS_CACHE/cri-tools-$CRI_TOOLS_VERSION/bin
MODULE=sigs.k8s.io/cri-tools

log() { echo "cri-tools-build: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ $CRI_TOOLS_VERSION =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "CRI_TOOLS_VERSION $CRI_TOOLS_VERSION is not of the form v1.MINOR.PATCH"

built() {
	[ -x "$BIN/critest" ] && [ -x "$BIN/crictl" ] &&
		[ "$(cat "$BIN/.version" 2>/dev/null)" = "$CRI_TOOLS_VERSION" ]
}

if built; then
	echo "$BIN"
	exit 0
fi

command -v go >/dev/null || die "go is needed to build cri-tools $CRI_TOOLS_VERSION"
work=$(mktemp -d /tmp/cri-tools-build.XXXXXX)
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0

log "building critest and crictl $CRI_TOOLS_VERSION into $BIN"
dir=$(cd "$work" && go mod download -json "$MODULE@$CRI_TOOLS_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -f "$dir/go.mod" ] || die "$MODULE@$CRI_TOOLS_VERSION: no go.mod in the module cache"
cp -r "$dir" "$work/src"
chmod -R u+w "$work/src"
cd "$work/src"

# What `crictl --version` reports, as in a release build.
ldflags="-s -w -X $MODULE/pkg/version.Version=${CRI_TOOLS_VERSION#v}"
mkdir -p "$BIN"
rm -f "$BIN/.version"
nice -n 19 go test -c -trimpath -ldflags "$ldflags" -o "$BIN/critest" ./cmd/critest
nice -n 19 go build -trimpath -ldflags "$ldflags" -o "$BIN/crictl" ./cmd/crictl
echo "$CRI_TOOLS_VERSION" >"$BIN/.version"
log "built in ${SECONDS}s"
echo "$BIN"

#!/usr/bin/env bash
# Build the Kubernetes binaries the e2e tier runs (kube-apiserver,
# kube-controller-manager (Deployments, EndpointSlices), kube-scheduler
# (the node installer's test: DaemonSet pods, RuntimeClass scheduling), kubelet,
# kube-proxy, kubectl) at one pinned version from the Go module proxy, into a
# cache directory outside the repository. A second run with the same version
# does nothing; changing K8S_VERSION builds into a new directory.
#
# k8s.io/kubernetes is not meant to be required as a module: its go.mod
# points every k8s.io/* staging module at ./staging with replace lines. The
# build therefore happens in a throwaway module (generated in a temporary
# directory) that requires k8s.io/kubernetes and replaces each module named in
# that replace block with its published v0.X.Y twin.
#
# Environment:
#   K8S_VERSION    Kubernetes version (default v1.34.4)
#   K8S_CACHE      cache root (default /var/cache/kvm-shim); binaries go to
#                  $K8S_CACHE/k8s-$K8S_VERSION/bin
#
# Prints the bin directory on stdout.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
K8S_CACHE=${K8S_CACHE:-/var/cache/kvm-shim}
BIN=$K8S_CACHE/k8s-$K8S_VERSION/bin
CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

log() { echo "k8s-build: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION $K8S_VERSION is not of the form v1.MINOR.PATCH"
minor=${BASH_REMATCH[1]}
staging_version=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}

built() {
	local c
	for c in "${CMDS[@]}"; do
		[ -x "$BIN/$c" ] || return 1
	done
	# The stamp is written last, after every binary is in place.
	[ "$(cat "$BIN/.version" 2>/dev/null)" = "$K8S_VERSION" ]
}

if built; then
	echo "$BIN"
	exit 0
fi

command -v go >/dev/null || die "go is needed to build Kubernetes $K8S_VERSION"
work=$(mktemp -d /tmp/k8s-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS=-buildvcs=false GOWORK=off CGO_ENABLED=0

log "building Kubernetes $K8S_VERSION (${CMDS[*]}) into $BIN"
go mod init kvm-shim.invalid/k8s-build >/dev/null 2>&1
kdir=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -f "$kdir/go.mod" ] || die "k8s.io/kubernetes@$K8S_VERSION: no go.mod in the module cache"

# The staging modules: every "k8s.io/X => ./staging/src/k8s.io/X" line.
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$kdir/go.mod")
[ "${#staging[@]}" -gt 10 ] || die "found only ${#staging[@]} staging modules in $kdir/go.mod"
edits=(-require "k8s.io/kubernetes@$K8S_VERSION")
for m in "${staging[@]}"; do
	edits+=(-replace "$m=$m@$staging_version")
done
go mod edit "${edits[@]}"

pkgs=()
for c in "${CMDS[@]}"; do
	pkgs+=("k8s.io/kubernetes/cmd/$c")
done
go get "${pkgs[@]/%/@$K8S_VERSION}" >/dev/null 2>&1 || go get "${pkgs[@]/%/@$K8S_VERSION}"

# What "kubectl version" and the apiserver report, as in a release build.
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
mkdir -p "$BIN"
rm -f "$BIN/.version"
go build -trimpath -ldflags "$ldflags" -o "$BIN/" "${pkgs[@]}"
echo "$K8S_VERSION" >"$BIN/.version"
log "built in ${SECONDS}s"
echo "$BIN"

#!/usr/bin/env bash
# Builds the node installer's image (`make deploy-image`) as an OCI image
# archive that any containerd imports (`ctr -n k8s.io images import`; no
# registry, no Docker), from the binaries `make build` and the installer
# build wrote to _output/bin, with hack/ocipack. It carries the installer,
# the shim and the emulator wrapper, the default config and deploy/deb's
# containerd snippets (the same files the Debian package ships). It also
# writes deploy/'s manifests to _output/deploy with the image's tag.
#
# Environment:
#   VERSION     the version (the Makefile's, from git describe); the tag is
#               it with any character a tag cannot hold made "_"
#   DEPLOY_OUT  output directory (default _output/deploy)
#   DEPLOY_BIN  where the three binaries are (default _output/bin)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${DEPLOY_BIN:-$ROOT/_output/bin}
OUT=${DEPLOY_OUT:-$ROOT/_output/deploy}
PKG=containerd-shim-kvm-v1
NAME=localhost/kvm-shim-installer
GO=${GO:-go}

die() { echo "deploy-image: error: $*" >&2; exit 1; }

[ -n "${VERSION:-}" ] || die "VERSION is not set (make deploy-image sets it)"
TAG=$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '_')
for f in "$BIN/$PKG" "$BIN/kvm-qemu-wrapper" "$BIN/kvm-shim-installer"; do
	[ -x "$f" ] || die "$f is missing (make build)"
done
mkdir -p "$OUT"
archive=$OUT/kvm-shim-installer-$TAG.tar
P=/opt/$PKG
# The image's timestamps: the commit's, so the same tree builds the same image.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}
(cd "$ROOT" && "$GO" run ./hack/ocipack -name "$NAME:$TAG" -out "$archive" \
	-file "/usr/local/bin/kvm-shim-installer=$BIN/kvm-shim-installer:0755" \
	-file "$P/bin/$PKG=$BIN/$PKG:0755" \
	-file "$P/bin/kvm-qemu-wrapper=$BIN/kvm-qemu-wrapper:0755" \
	-file "$P/config.toml=config.example.toml:0644" \
	-file "$P/containerd/containerd-v2.toml=deploy/deb/containerd-v2.toml:0644" \
	-file "$P/containerd/containerd-v2-runc.toml=deploy/deb/containerd-v2-runc.toml:0644" \
	-file "$P/containerd/containerd-v3.toml=deploy/deb/containerd-v3.toml:0644" \
	-entrypoint /usr/local/bin/kvm-shim-installer \
	-label "org.opencontainers.image.version=$VERSION")
grep -q "image: $NAME:latest" "$ROOT/deploy/installer.yaml" || die "deploy/installer.yaml does not name $NAME:latest"
sed "s|image: $NAME:latest|image: $NAME:$TAG|" "$ROOT/deploy/installer.yaml" >"$OUT/installer.yaml"
cp "$ROOT/deploy/runtimeclass.yaml" "$OUT/runtimeclass.yaml"
echo "$archive"

#!/usr/bin/env bash
# Builds the Debian package of containerd-shim-kvm-v1 (`make deb`) into
# _output/deb/ from the binaries `make build` wrote to _output/bin.
#
# Why dpkg-deb directly, not nfpm or debhelper: the package is two static
# binaries, a config, two containerd snippets and three short maintainer
# scripts; dpkg-deb is on every Debian machine already, so the build needs
# nothing else, and lintian checks the result.
#
# Environment:
#   DEB_VERSION  package version (default 0.0.<commits>+g<short hash>, which
#                grows with every commit, so a later build upgrades an
#                earlier one)
#   DEB_OUT      output directory (default _output/deb)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/deploy/deb
PKG=containerd-shim-kvm-v1
BIN=$ROOT/_output/bin
OUT=${DEB_OUT:-$ROOT/_output/deb}

die() { echo "deb: error: $*" >&2; exit 1; }

if [ -z "${DEB_VERSION:-}" ]; then
	count=$(git -C "$ROOT" rev-list --count HEAD 2>/dev/null) || die "not a git checkout: set DEB_VERSION"
	DEB_VERSION=0.0.$count+g$(git -C "$ROOT" rev-parse --short=7 HEAD)
fi
[[ $DEB_VERSION =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || die "DEB_VERSION=$DEB_VERSION is not a Debian native version (a digit, then letters, digits and . + ~)"
for f in "$BIN/$PKG" "$BIN/kvm-qemu-wrapper"; do
	[ -x "$f" ] || die "$f is missing (make build)"
done
ARCH=$(dpkg --print-architecture)
# The changelog's date: the commit's, so the same tree builds the same package.
EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
umask 022

install -D -m 0755 "$BIN/$PKG" "$STAGE/usr/bin/$PKG"
install -D -m 0755 "$BIN/kvm-qemu-wrapper" "$STAGE/usr/libexec/$PKG/kvm-qemu-wrapper"
# The default config, with the wrapper where the package puts it.
mkdir -p "$STAGE/etc/$PKG"
grep -q '^qemu_wrapper = ' "$ROOT/config.example.toml" || die "config.example.toml has no qemu_wrapper line"
sed "s|^qemu_wrapper = .*|qemu_wrapper = \"/usr/libexec/$PKG/kvm-qemu-wrapper\"|" \
	"$ROOT/config.example.toml" >"$STAGE/etc/$PKG/config.toml"
chmod 0644 "$STAGE/etc/$PKG/config.toml"
install -D -m 0644 "$HERE/containerd-v2.toml" "$STAGE/usr/share/$PKG/containerd/containerd-v2.toml"
install -D -m 0644 "$HERE/containerd-v2-runc.toml" "$STAGE/usr/share/$PKG/containerd/containerd-v2-runc.toml"
install -D -m 0644 "$HERE/containerd-v3.toml" "$STAGE/usr/share/$PKG/containerd/containerd-v3.toml"

DOC=$STAGE/usr/share/doc/$PKG
install -D -m 0644 "$HERE/copyright" "$DOC/copyright"
install -D -m 0644 "$HERE/lintian-overrides" "$STAGE/usr/share/lintian/overrides/$PKG"
{
	echo "$PKG ($DEB_VERSION) unstable; urgency=medium"
	echo
	echo "  * Built from $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "an unknown commit")."
	echo
	echo " -- containerd-shim-kvm-v1 developers <$PKG@users.noreply.github.com>  $(LC_ALL=C date -u -R -d "@$EPOCH")"
} | gzip -9n >"$DOC/changelog.gz"
chmod 0644 "$DOC/changelog.gz"

mkdir -p "$STAGE/DEBIAN"
install -m 0755 "$HERE/postinst" "$HERE/prerm" "$HERE/postrm" "$STAGE/DEBIAN/"
echo "/etc/$PKG/config.toml" >"$STAGE/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s|@VERSION@|$DEB_VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@SIZE@|$size|" \
	"$HERE/control.in" >"$STAGE/DEBIAN/control"

mkdir -p "$OUT"
deb=$OUT/${PKG}_${DEB_VERSION}_$ARCH.deb
find "$STAGE" -exec touch -h -d "@$EPOCH" {} +
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$deb" >/dev/null
echo "$deb"

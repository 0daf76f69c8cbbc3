// Package integration drives the freshly built containerd-shim-kvm-v1 through
// real containerd (Debian's 1.6 and a 2.x build), libvirtd and QEMU, with ctr
// and with a CRI client the way kubelet would.
//
// The tests carry the build tag integration, so plain `go test ./...` skips
// them. Run as root after hack/setup-host.sh and hack/guest/build.sh:
//
//	go test -tags integration -v -timeout 60m ./integration/
//
// Environment:
//
//	KVM_IT_FLAVOURS  comma-separated containerd flavours to run (default "1.6,2.x")
//	KVM_IT_IMAGES    directory of guest image archives (default <repo>/_output/images)
package integration

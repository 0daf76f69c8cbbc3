// Package e2e runs the freshly built containerd-shim-kvm-v1 under a real
// single-node Kubernetes cluster (internal/kube: etcd, kube-apiserver,
// kube-controller-manager, kubelet, kube-proxy) on private containerd 1.6
// and 2.x daemons, and asserts through kubectl what a user sees.
//
// The tests carry the build tag e2e, so plain `go test ./...` skips them.
// Run as root after hack/setup-host.sh, hack/guest/build.sh and
// hack/k8s/build.sh (make e2e does all three):
//
//	go test -tags e2e -v -timeout 60m ./integration/e2e/
//
// Environment:
//
//	KVM_IT_FLAVOURS   comma-separated containerd flavours (default "1.6,2.x")
//	KVM_IT_IMAGES     directory of guest image archives (default <repo>/_output/images)
//	KVM_E2E_K8S_BIN   directory of the Kubernetes binaries (default: what hack/k8s/build.sh prints)
package e2e

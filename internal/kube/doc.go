// Package kube runs a private Kubernetes cluster for the e2e tests: its
// own PKI, an etcd, kube-apiserver, kube-controller-manager, optionally
// kube-scheduler, kubelet and kube-proxy (iptables mode), all on this
// machine, on their own ports, data directories and sockets, against a
// containerd the caller started (internal/testenv). Further nodes
// (Options.Nodes) add a kubelet each, against a containerd of their own. The binaries come from hack/k8s/build.sh.
// Stop ends only the processes Start started, by pid, and removes what
// they made on the host (the node's link, kube-proxy's rules).
package kube

module github.com/kvm-shim/containerd-shim-kvm-v1

go 1.26.0

replace github.com/digitalocean/go-libvirt => /usr/share/gocode/src/github.com/digitalocean/go-libvirt

require github.com/digitalocean/go-libvirt v0.0.0-00010101000000-000000000000

require (
	github.com/containerd/errdefs v1.0.0 // indirect
	github.com/containerd/log v0.2.0 // indirect
	github.com/cyphar/filepath-securejoin v0.5.1 // indirect
	github.com/gogo/protobuf v1.3.2 // indirect
	github.com/golang/protobuf v1.5.3 // indirect
	github.com/sirupsen/logrus v1.10.2 // indirect
	golang.org/x/net v0.14.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.12.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20230822172742-b8732ec3820d // indirect
	google.golang.org/grpc v1.59.0 // indirect
	google.golang.org/protobuf v1.31.0 // indirect
	k8s.io/cri-api v0.27.1 // indirect
)

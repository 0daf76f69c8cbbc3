module github.com/kvm-shim/containerd-shim-kvm-v1

go 1.25.0

replace github.com/digitalocean/go-libvirt => /usr/share/gocode/src/github.com/digitalocean/go-libvirt

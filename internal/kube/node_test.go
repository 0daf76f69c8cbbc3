package kube

import (
	"net"
	"strings"
	"testing"
)

func TestCheckNodes(t *testing.T) {
	base := func() Options {
		return Options{Node: "n1", NodeIP: net.IPv4(10, 0, 0, 1), CRISocket: "/run/a.sock", Ports: DefaultPorts}
	}
	good := Node{Name: "n2", IP: net.IPv4(10, 0, 0, 2), CRISocket: "/run/b.sock", Dir: "/tmp/n2", CgroupRoot: "/n2",
		KubeletPort: 30000, KubeletHealthzPort: 30001}
	cases := []struct {
		name string
		edit func(*Node)
		want string // "" for no error
	}{
		{"good", func(*Node) {}, ""},
		{"no name", func(n *Node) { n.Name = "" }, "are required"},
		{"relative dir", func(n *Node) { n.Dir = "n2" }, "are required"},
		{"no ports", func(n *Node) { n.KubeletPort = 0 }, "are required"},
		{"first node's name", func(n *Node) { n.Name = "n1" }, "shares"},
		{"first node's IP", func(n *Node) { n.IP = net.IPv4(10, 0, 0, 1) }, "shares"},
		{"first node's socket", func(n *Node) { n.CRISocket = "/run/a.sock" }, "shares"},
		{"first node's cgroup root", func(n *Node) { n.CgroupRoot = CgroupRoot }, "shares"},
		{"first node's kubelet port", func(n *Node) { n.KubeletPort = DefaultPorts.Kubelet }, "shares"},
		{"one port twice", func(n *Node) { n.KubeletHealthzPort = n.KubeletPort }, "shares"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := base()
			n := good
			c.edit(&n)
			o.Nodes = []Node{n}
			err := o.checkNodes()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `"`+n.Name+`"`) {
				t.Fatalf("checkNodes: %v, want an error naming node %q with %q", err, n.Name, c.want)
			}
		})
	}
	o := base()
	o.Nodes = []Node{good, good}
	if err := o.checkNodes(); err == nil {
		t.Fatal("two nodes of one name: no error")
	}
}

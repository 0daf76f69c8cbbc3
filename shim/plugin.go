package shim

import (
	"github.com/containerd/containerd/pkg/shutdown"
	"github.com/containerd/containerd/plugin"
	"github.com/containerd/containerd/runtime/v2/shim"
)

func init() {
	plugin.Register(&plugin.Registration{
		Type:     plugin.TTRPCPlugin,
		ID:       "task",
		Requires: []plugin.Type{plugin.EventPlugin, plugin.InternalPlugin},
		InitFn: func(ic *plugin.InitContext) (interface{}, error) {
			pub, err := ic.GetByID(plugin.EventPlugin, "publisher")
			if err != nil {
				return nil, err
			}
			sd, err := ic.GetByID(plugin.InternalPlugin, "shutdown")
			if err != nil {
				return nil, err
			}
			return newService(ic.Context, pub.(shim.Publisher), sd.(shutdown.Service))
		},
	})
}

package shim

import (
	"fmt"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/kvm-shim/containerd-shim-kvm-v1/vm"
)

// configPath takes the config path from the task's runtime options: CRI
// and `ctr run --runtime-config-path` both send runtimeoptions.Options.
func configPath(options *anypb.Any) (string, error) {
	if options == nil || len(options.GetValue()) == 0 && options.GetTypeUrl() == "" {
		return "", nil
	}
	v, err := typeurl.UnmarshalAny(options)
	if err != nil {
		return "", fmt.Errorf("decode runtime options: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	o, ok := v.(*runtimeoptions.Options)
	if !ok {
		return "", fmt.Errorf("runtime options of type %s are not for this runtime; use runtimeoptions.v1.Options with ConfigPath: %w",
			options.GetTypeUrl(), errdefs.ErrInvalidArgument)
	}
	if len(o.ConfigBody) > 0 {
		return "", fmt.Errorf("runtime options ConfigBody is not supported; use ConfigPath: %w", errdefs.ErrInvalidArgument)
	}
	return o.ConfigPath, nil
}

// metrics reports VM statistics as cgroups v1 Metrics, the type CRI
// decodes (a foreign type fails CRI's whole stats call). CPU is QEMU's
// total CPU time; memory is the QEMU process's resident set.
func metrics(st vm.Stats) (*anypb.Any, error) {
	m := &cgroup1stats.Metrics{
		CPU: &cgroup1stats.CPUStat{Usage: &cgroup1stats.CPUUsage{Total: st.CPUTimeNs}},
		Memory: &cgroup1stats.MemoryStat{
			RSS: st.RSSBytes, TotalRSS: st.RSSBytes,
			Usage: &cgroup1stats.MemoryEntry{Usage: st.RSSBytes, Limit: st.MemoryBytes},
		},
	}
	a, err := typeurl.MarshalAny(m)
	if err != nil {
		return nil, err
	}
	return protobuf.FromAny(a), nil
}

package shim

import (
	"encoding/json"
	"fmt"
	"io"

	apitypes "github.com/containerd/containerd/api/types"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// featuresTypeURL is how containerd 2.x names runtime-spec features.
const featuresTypeURL = "types.containerd.io/opencontainers/runtime-spec/1/features/Features"

// WriteRuntimeInfo answers containerd 2.x's `-info`: the runtime's name,
// version and OCI features, as a protobuf RuntimeInfo. A VM supports none
// of the Linux container features (namespaces, cgroups, seccomp, idmap).
func WriteRuntimeInfo(w io.Writer, version, revision string) error {
	f, err := json.Marshal(&features.Features{OCIVersionMin: "1.0.0", OCIVersionMax: "1.1.0"})
	if err != nil {
		return err
	}
	b, err := proto.Marshal(&apitypes.RuntimeInfo{
		Name:     RuntimeName,
		Version:  &apitypes.RuntimeVersion{Version: version, Revision: revision},
		Features: &anypb.Any{TypeUrl: featuresTypeURL, Value: f},
	})
	if err != nil {
		return fmt.Errorf("marshal runtime info: %w", err)
	}
	_, err = w.Write(b)
	return err
}

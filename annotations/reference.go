package annotations

import (
	"fmt"
	"io"
	"strings"
)

// referenceHead opens docs/annotations.md.
const referenceHead = "# Annotations\n\n" +
	"<!-- Generated from package annotations (annotations/annotations.go) by\n" +
	"`go generate ./annotations`; edit the package, not this page. -->\n\n" +
	"Every `" + Prefix + "*` annotation the shim reads. The keys and this page\n" +
	"come from one Go package, `annotations` (`annotations/annotations.go`),\n" +
	"which the shim's code uses; a unit test fails while the page and the\n" +
	"package differ.\n\n" +
	"Set them on the pod or the container, or with `ctr run --annotation\n" +
	"key=value`. Through CRI they reach the shim only when the runtime handler\n" +
	"lists them in `pod_annotations` / `container_annotations`\n" +
	"(`[\"" + Prefix + "*\"]`, see [install.md](install.md)); without that,\n" +
	"containerd drops them without a word. The shim reads them from the\n" +
	"container's OCI spec, where CRI puts both kinds.\n\n" +
	"A malformed value fails `Create` with `InvalidArgument` and a message that\n" +
	"names the annotation; nothing is left behind. Every annotation is read\n" +
	"once, at `Create`: changing it on a running pod changes nothing until the\n" +
	"container is created again. Other keys under `" + Prefix + "` are\n" +
	"ignored. The label `" + Prefix + "runtime=ready`, which the node installer\n" +
	"sets ([install-cluster.md](install-cluster.md)), is a node label for the\n" +
	"RuntimeClass's `nodeSelector`, not an annotation the shim reads.\n"

// referenceTail closes docs/annotations.md.
const referenceTail = "## CRI annotations the shim reads\n\n" +
	"Not set by users, listed for completeness (`shim/service.go`): CRI's\n" +
	"`io.kubernetes.cri.container-type` (`sandbox` runs no VM),\n" +
	"`io.kubernetes.cri.sandbox-id` (groups a pod's containers into one shim),\n" +
	"`io.kubernetes.cri.sandbox-uid`, `-name`, `-namespace` and\n" +
	"`io.kubernetes.cri.container-name` (the VM's identity, domain name and\n" +
	"disk location) and `io.kubernetes.cri.image-name` (recorded with the pod's\n" +
	"disk overlay).\n"

// WriteReference writes the annotation reference (docs/annotations.md):
// a summary table of every key, then a section per key, group by group.
func WriteReference(w io.Writer) error {
	var b strings.Builder
	b.WriteString(referenceHead)
	b.WriteString("\n## Summary\n\n| annotation | value | default |\n|---|---|---|\n")
	for _, g := range Reference {
		for _, k := range g.Keys {
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", k.Name, k.Value, k.Default)
		}
	}
	b.WriteString("\nThe `max_*`, `default_*`, `hotplug_*` and other snake_case names are keys\n" +
		"of the shim's [configuration](configuration.md).\n")
	for _, g := range Reference {
		fmt.Fprintf(&b, "\n## %s\n", g.Title)
		if g.Intro != "" {
			fmt.Fprintf(&b, "\n%s\n", g.Intro)
		}
		for _, k := range g.Keys {
			fmt.Fprintf(&b, "\n### %s\n\n%s\n", k.Name, k.Doc)
		}
	}
	b.WriteString("\n" + referenceTail)
	_, err := io.WriteString(w, b.String())
	return err
}

package docslinks

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// AnnotationPrefix is the prefix of the shim's own annotation keys.
const AnnotationPrefix = "kvm.containerd.io/"

var (
	// A key written out in Go: "kvm.containerd.io/vcpus".
	literalKey = regexp.MustCompile(`"kvm\.containerd\.io/([a-z0-9][a-z0-9.-]*)"`)
	// A key built from the prefix constant: Prefix + "user-data" (package
	// annotations), or AnnotationPrefix + "user-data".
	prefixedKey = regexp.MustCompile(`\b(?:Annotation)?Prefix\s*\+\s*"([a-z0-9][a-z0-9.-]*)"`)
	// A key's heading in docs/annotations.md: ### kvm.containerd.io/vcpus
	documentedKey = regexp.MustCompile("(?m)^###\\s+`?kvm\\.containerd\\.io/([a-z0-9][a-z0-9.-]*)`?\\s*$")
)

// NodeLabels are the kvm.containerd.io/* keys that are node labels or
// node resources, not pod annotations, each with the page that documents
// it: the annotation reference leaves them out.
var NodeLabels = map[string]string{
	"runtime": "docs/install-cluster.md", // set by the node installer
	"vcpu":    "docs/install-cluster.md", // the node's extended resource, advertised by the node installer
}

// CodeAnnotationKeys returns the kvm.containerd.io/* keys (without the
// prefix) named in the non-test Go files below root, each with the files
// that name it.
func CodeAnnotationKeys(root string) (map[string][]string, error) {
	keys := map[string][]string{}
	err := walkFiles(root, func(rel string) error {
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return err
		}
		for _, re := range []*regexp.Regexp{literalKey, prefixedKey} {
			for _, m := range re.FindAllSubmatch(b, -1) {
				k := string(m[1])
				if _, label := NodeLabels[k]; label {
					continue
				}
				if n := len(keys[k]); n == 0 || keys[k][n-1] != rel {
					keys[k] = append(keys[k], rel)
				}
			}
		}
		return nil
	})
	return keys, err
}

// DocumentedAnnotationKeys returns the keys that have a heading of their
// own in the annotation reference at path.
func DocumentedAnnotationKeys(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, m := range documentedKey.FindAllSubmatch(b, -1) {
		keys = append(keys, string(m[1]))
	}
	sort.Strings(keys)
	return keys, nil
}

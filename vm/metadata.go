package vm

import (
	"encoding/xml"
	"fmt"

	"libvirt.org/go/libvirtxml"
)

// MetadataNamespace is the XML namespace of the shim's element inside the
// domain's <metadata>.
const MetadataNamespace = "https://github.com/kvm-shim/containerd-shim-kvm-v1/metadata/v1"

// vmMetaXML is the shim's own element inside <metadata>. It stays a struct
// of ours: libvirt's schema leaves <metadata> open to any namespaced
// element, so libvirtxml models it only as raw inner XML
// (DomainMetadata.XML); encoding/xml still does every escape, and the
// element is read back (Conn.Metadata) with the same tags.
type vmMetaXML struct {
	XMLName xml.Name `xml:"https://github.com/kvm-shim/containerd-shim-kvm-v1/metadata/v1 vm"`
	Metadata
}

// domainMetadata is the <metadata> of a domain carrying m, indented to
// sit inside the domain's own indentation.
func domainMetadata(m Metadata) (*libvirtxml.DomainMetadata, error) {
	inner, err := xml.MarshalIndent(vmMetaXML{Metadata: m}, "    ", "  ")
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return &libvirtxml.DomainMetadata{XML: "\n" + string(inner) + "\n  "}, nil
}

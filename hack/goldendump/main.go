// Command goldendump shows that two sets of golden domain XML files mean
// the same domains to libvirt: it defines each old and each new file in
// libvirtd (qemu:///system), dumps both with their inactive XML, undefines
// them and compares the dumps. It was written to prove that moving
// vm.Render from hand-written structs to libvirtxml changed no domain:
//
//	git show <old-commit>:vm/testdata/... > old/...   (each golden file)
//	go run ./hack/goldendump -old old -new vm/testdata
//
// Every domain is defined under one throwaway name and UUID and as domain
// type qemu (the goldens' kvm domains cannot be defined where /dev/kvm
// cannot run them); the files are otherwise passed as they are. It exits
// 1 when a pair differs and prints the two dumps' differing lines.
package main

import (
	"bytes"
	"crypto/rand"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
)

func main() {
	oldDir := flag.String("old", "", "directory of the old golden files")
	newDir := flag.String("new", "vm/testdata", "directory of the new golden files")
	sock := flag.String("socket", "/run/libvirt/libvirt-sock", "libvirtd's read-write socket")
	flag.Parse()
	if *oldDir == "" {
		fmt.Fprintln(os.Stderr, "goldendump: -old is required")
		os.Exit(2)
	}
	differ, err := run(*oldDir, *newDir, *sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "goldendump:", err)
		os.Exit(2)
	}
	if differ {
		os.Exit(1)
	}
}

func run(oldDir, newDir, sock string) (differ bool, err error) {
	files, err := filepath.Glob(filepath.Join(newDir, "*.xml"))
	if err != nil || len(files) == 0 {
		return false, fmt.Errorf("no golden files in %s (%v)", newDir, err)
	}
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return false, err
	}
	l := libvirt.NewWithDialer(connDialer{c})
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return false, err
	}
	defer func() { _ = l.Disconnect() }()
	for _, f := range files {
		name := filepath.Base(f)
		same, diff, err := comparePair(l, filepath.Join(oldDir, name), f)
		if err != nil {
			return differ, fmt.Errorf("%s: %w", name, err)
		}
		if same {
			fmt.Printf("%-40s same dumpxml\n", name)
			continue
		}
		differ = true
		fmt.Printf("%-40s DIFFERENT dumpxml:\n%s", name, diff)
	}
	return differ, nil
}

// connDialer hands go-libvirt an open connection.
type connDialer struct{ c net.Conn }

func (d connDialer) Dial() (net.Conn, error) { return d.c, nil }

// comparePair defines, dumps and undefines both files and compares the
// dumps.
func comparePair(l *libvirt.Libvirt, oldFile, newFile string) (bool, string, error) {
	var uuid libvirt.UUID
	if _, err := rand.Read(uuid[:]); err != nil {
		return false, "", err
	}
	uuid[6] = uuid[6]&0x0f | 0x40
	uuid[8] = uuid[8]&0x3f | 0x80
	id := fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:16])
	name := fmt.Sprintf("kvmshim-goldendump-%d", os.Getpid())
	var dumps [2]string
	for i, f := range []string{oldFile, newFile} {
		b, err := os.ReadFile(f)
		if err != nil {
			return false, "", err
		}
		x, err := throwaway(b, name, id)
		if err != nil {
			return false, "", fmt.Errorf("%s: %w", f, err)
		}
		if dumps[i], err = defineDump(l, x); err != nil {
			return false, "", fmt.Errorf("%s: %w", f, err)
		}
	}
	if dumps[0] == dumps[1] {
		return true, "", nil
	}
	return false, lineDiff(dumps[0], dumps[1]), nil
}

// defineDump defines x, returns its inactive XML and undefines it.
func defineDump(l *libvirt.Libvirt, x string) (string, error) {
	d, err := l.DomainDefineXML(x)
	if err != nil {
		return "", fmt.Errorf("define: %w", err)
	}
	dump, dumpErr := l.DomainGetXMLDesc(d, libvirt.DomainXMLInactive)
	undefErr := l.DomainUndefineFlags(d, 0)
	return dump, errors.Join(dumpErr, undefErr)
}

// throwaway copies a domain's XML token by token, with the domain's type,
// name and uuid replaced. Raw tokens keep namespace declarations as the
// file wrote them.
func throwaway(in []byte, name, uuid string) (string, error) {
	dec := xml.NewDecoder(bytes.NewReader(in))
	var out bytes.Buffer
	enc := xml.NewEncoder(&out)
	var path []string
	for {
		tok, err := dec.RawToken()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			path = append(path, t.Name.Local)
			if len(path) == 1 {
				t = setAttr(t, "type", "qemu")
			}
			tok = t
		case xml.EndElement:
			path = path[:len(path)-1]
		case xml.CharData:
			switch strings.Join(path, "/") {
			case "domain/name":
				tok = xml.CharData(name)
			case "domain/uuid":
				tok = xml.CharData(uuid)
			}
		}
		if err := enc.EncodeToken(xml.CopyToken(tok)); err != nil {
			return "", err
		}
	}
	if err := enc.Flush(); err != nil {
		return "", err
	}
	return out.String(), nil
}

func setAttr(t xml.StartElement, name, value string) xml.StartElement {
	attrs := make([]xml.Attr, len(t.Attr))
	copy(attrs, t.Attr)
	for i, a := range attrs {
		if a.Name.Space == "" && a.Name.Local == name {
			attrs[i].Value = value
		}
	}
	t.Attr = attrs
	return t
}

// lineDiff lists the lines only one of the dumps has.
func lineDiff(a, b string) string {
	count := map[string]int{}
	for _, l := range strings.Split(a, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(b, "\n") {
		count[l]--
	}
	var s strings.Builder
	for _, l := range strings.Split(a, "\n") {
		if count[l] > 0 {
			fmt.Fprintf(&s, "  - %s\n", l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if count[l] < 0 {
			fmt.Fprintf(&s, "  + %s\n", l)
		}
	}
	return s.String()
}

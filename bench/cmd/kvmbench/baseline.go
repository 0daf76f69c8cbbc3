package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// domainTemplate is the baseline's domain: the shim's domain XML without
// its name, UUID and <metadata> (the shim must not take the baseline's
// domains for its own), the shim's files replaced by the copies in
// filesDir. Everything else (devices, sizes, pinning, emulator) stays as
// the shim rendered it. Each run gets its own name, UUID and console
// paths (instance).
type domainTemplate struct {
	xml      string // the domain, with the console in filesDir
	filesDir string
}

// shimDomain parses the shim's domain XML and finds its VM dir: the
// directory of the console log.
func shimDomain(x string) (*libvirtxml.Domain, string, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(x); err != nil {
		return nil, "", fmt.Errorf("parse the shim's domain XML: %w", err)
	}
	if d.Devices != nil {
		for _, s := range d.Devices.Serials {
			if s.Log != nil && filepath.Base(s.Log.File) == "console.log" {
				return &d, filepath.Dir(s.Log.File), nil
			}
		}
	}
	return nil, "", fmt.Errorf("no console log in the shim's domain XML:\n%s", x)
}

// baselineTemplate makes the shim's domain d, whose files under vmDir
// were copied to filesDir, the baseline's template. It refuses a domain
// that still names the shim's state dir after that (a disk overlay).
func baselineTemplate(d *libvirtxml.Domain, vmDir, filesDir, stateDir string) (*domainTemplate, error) {
	d.Name, d.UUID, d.Metadata = "", "", nil
	var stateRefs []string
	mapStrings(reflect.ValueOf(d), func(s string) string {
		if rest, ok := strings.CutPrefix(s, vmDir+"/"); ok {
			s = filepath.Join(filesDir, rest)
		}
		if strings.Contains(s, stateDir+"/") {
			stateRefs = append(stateRefs, s)
		}
		return s
	})
	if len(stateRefs) > 0 {
		return nil, fmt.Errorf("the domain XML still names the shim's state dir %s (%s, a disk overlay?): "+
			"only direct kernel boot images are supported", stateDir, strings.Join(stateRefs, ", "))
	}
	x, err := d.Marshal()
	if err != nil {
		return nil, err
	}
	return &domainTemplate{xml: x, filesDir: filesDir}, nil
}

// instance is the template's domain XML for one run: its own name and
// UUID, and the console's socket and log in runDir.
func (t *domainTemplate) instance(name, uuid, runDir string) (string, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(t.xml); err != nil {
		return "", err
	}
	d.Name, d.UUID = name, uuid
	found := false
	mapStrings(reflect.ValueOf(&d), func(s string) string {
		for _, f := range []string{"console.sock", "console.log"} {
			if s == filepath.Join(t.filesDir, f) {
				found = found || f == "console.log"
				return filepath.Join(runDir, f)
			}
		}
		return s
	})
	if !found {
		return "", errors.New("the domain XML has no console log")
	}
	return d.Marshal()
}

// mapStrings replaces every exported string field below v by f of it.
func mapStrings(v reflect.Value, f func(string) string) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			mapStrings(v.Elem(), f)
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			mapStrings(v.Index(i), f)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				mapStrings(v.Field(i), f)
			}
		}
	case reflect.String:
		if v.CanSet() {
			v.SetString(f(v.String()))
		}
	}
}

// Command ocipack writes a single-layer OCI image archive (an OCI image
// layout packed in a tar file) that `ctr images import` accepts.
//
// The output is deterministic: the same inputs give the same bytes and
// therefore the same digests. Every timestamp is set to SOURCE_DATE_EPOCH
// (or 0), layer entries are sorted by path, owners are the ones given on the
// command line (default 0:0), parent directories are written as explicit
// entries, and gzip streams carry no name or timestamp.
//
// Example:
//
//	ocipack -name localhost/kvm-guest/bios:latest -out bios.tar \
//	    -file /disk/guest.qcow2=_output/guest.qcow2:0444:107:107
//	ocipack -name localhost/kvm-guest/pause:latest -out pause.tar \
//	    -file /pause=_output/pause:0755 -entrypoint /pause
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// multiFlag collects every occurrence of a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }

func (m *multiFlag) Set(v string) error {
	*m = append(*m, v)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ocipack:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ocipack", flag.ContinueOnError)
	var (
		name       = fs.String("name", "", "full image name, e.g. localhost/kvm-guest/bios:latest (required)")
		out        = fs.String("out", "", "output archive path (required)")
		osName     = fs.String("os", "linux", "image config os")
		arch       = fs.String("arch", "amd64", "image config architecture")
		workdir    = fs.String("workdir", "", "image config WorkingDir")
		epochFlag  = fs.Int64("epoch", -1, "timestamp for every entry, seconds since 1970 (default: $SOURCE_DATE_EPOCH or 0)")
		files      multiFlag
		dirs       multiFlag
		symlinks   multiFlag
		entrypoint multiFlag
		cmd        multiFlag
		env        multiFlag
		labels     multiFlag
	)
	fs.Var(&files, "file", "add a regular file: /dest=hostpath[:mode[:uid:gid]] (repeatable)")
	fs.Var(&dirs, "dir", "add a directory: /dest[:mode[:uid:gid]] (repeatable)")
	fs.Var(&symlinks, "symlink", "add a symbolic link: /dest=target (repeatable)")
	fs.Var(&entrypoint, "entrypoint", "append one argument to the config Entrypoint (repeatable)")
	fs.Var(&cmd, "cmd", "append one argument to the config Cmd (repeatable)")
	fs.Var(&env, "env", "add KEY=VALUE to the config Env (repeatable)")
	fs.Var(&labels, "label", "add KEY=VALUE to the config Labels (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *name == "" || *out == "" {
		return fmt.Errorf("-name and -out are required")
	}

	epoch, err := entryEpoch(*epochFlag)
	if err != nil {
		return err
	}

	spec := Spec{
		Name:       *name,
		OS:         *osName,
		Arch:       *arch,
		Entrypoint: entrypoint,
		Cmd:        cmd,
		Env:        env,
		WorkingDir: *workdir,
		Labels:     map[string]string{},
		Time:       time.Unix(epoch, 0).UTC(),
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("bad -label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	for _, kind := range []struct {
		args  []string
		parse func(string) (Entry, error)
	}{{files, parseFile}, {dirs, parseDir}, {symlinks, parseSymlink}} {
		for _, a := range kind.args {
			e, err := kind.parse(a)
			if err != nil {
				return err
			}
			spec.Entries = append(spec.Entries, e)
		}
	}
	return WriteArchive(*out, spec)
}

// entryEpoch is the timestamp of every entry: the -epoch flag's value, or
// when that is unset (negative) $SOURCE_DATE_EPOCH, or 0.
func entryEpoch(flagValue int64) (int64, error) {
	if flagValue >= 0 {
		return flagValue, nil
	}
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad SOURCE_DATE_EPOCH %q", s)
	}
	return v, nil
}

// parseOwner parses the optional "mode[:uid:gid]" suffix fields.
func parseOwner(fields []string, e *Entry) error {
	if len(fields) == 0 {
		return nil
	}
	mode, err := strconv.ParseUint(fields[0], 8, 32)
	if err != nil || mode > 0o7777 {
		return fmt.Errorf("bad mode %q (want octal, e.g. 0644)", fields[0])
	}
	e.Mode = int64(mode)
	switch len(fields) {
	case 1:
		return nil
	case 3:
		uid, err1 := strconv.Atoi(fields[1])
		gid, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || uid < 0 || gid < 0 {
			return fmt.Errorf("bad owner %q:%q", fields[1], fields[2])
		}
		e.UID, e.GID = uid, gid
		return nil
	default:
		return fmt.Errorf("bad suffix %q: want mode or mode:uid:gid", strings.Join(fields, ":"))
	}
}

// isNumeric reports whether s is a non-empty string of decimal digits.
func isNumeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// splitSuffix splits "path:mode:uid:gid" or "path:mode" into the path and
// its numeric suffix fields. Only trailing all-digit fields count as suffix,
// so a host path may itself contain ':' as long as what follows its last ':'
// is not a number.
func splitSuffix(s string) (string, []string) {
	parts := strings.Split(s, ":")
	n := 0
	for i := len(parts) - 1; i > 0 && n < 3 && isNumeric(parts[i]); i-- {
		n++
	}
	if n == 2 {
		// The only forms are ":mode" and ":mode:uid:gid", so with two
		// trailing numbers the first one belongs to the path.
		n = 1
	}
	return strings.Join(parts[:len(parts)-n], ":"), parts[len(parts)-n:]
}

func parseFile(s string) (Entry, error) {
	dest, rest, ok := strings.Cut(s, "=")
	if !ok || dest == "" || rest == "" {
		return Entry{}, fmt.Errorf("bad -file %q: want /dest=hostpath[:mode[:uid:gid]]", s)
	}
	src, suffix := splitSuffix(rest)
	e := Entry{Path: dest, Type: TypeFile, Source: src, Mode: -1}
	if err := parseOwner(suffix, &e); err != nil {
		return Entry{}, fmt.Errorf("-file %q: %w", s, err)
	}
	return e, nil
}

func parseDir(s string) (Entry, error) {
	dest, suffix := splitSuffix(s)
	if dest == "" {
		return Entry{}, fmt.Errorf("bad -dir %q", s)
	}
	e := Entry{Path: dest, Type: TypeDir, Mode: 0o755}
	if err := parseOwner(suffix, &e); err != nil {
		return Entry{}, fmt.Errorf("-dir %q: %w", s, err)
	}
	return e, nil
}

func parseSymlink(s string) (Entry, error) {
	dest, target, ok := strings.Cut(s, "=")
	if !ok || dest == "" || target == "" {
		return Entry{}, fmt.Errorf("bad -symlink %q: want /dest=target", s)
	}
	return Entry{Path: dest, Type: TypeSymlink, Target: target, Mode: 0o777}, nil
}

package configdrive

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/internal/childproc"
)

// Label is the volume label guests look for.
const Label = "config-2"

// VFATSize is the size of a vfat config drive (sparse), as nova makes it.
const VFATSize = 64 << 20

// versions are the openstack/ directories written, each with the same files:
// one dated version cloud-init and cloudbase-init know, and "latest".
var versions = []string{"2018-08-27", "latest"}

// randomSeedLen is the size of meta_data.json "random_seed" (nova's).
const randomSeedLen = 512

// file is one file of the drive, path relative to the drive's root.
type file struct {
	path string
	data []byte
}

// render returns the drive's files in a fixed order.
func render(inst Instance, network *Network, opts Options, seed []byte) ([]file, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	md, err := renderMetaData(inst, opts, seed)
	if err != nil {
		return nil, err
	}
	nd, err := renderNetworkData(network)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	vl, vd, err := renderVolumes(inst.Volumes)
	if err != nil {
		return nil, err
	}
	var files []file
	if network != nil {
		gn, err := renderGuestNetwork(network)
		if err != nil {
			return nil, fmt.Errorf("network: %w", err)
		}
		files = append(files, file{GuestNetworkFile, gn})
	}
	for _, v := range versions {
		dir := "openstack/" + v + "/"
		files = append(files,
			file{dir + "meta_data.json", md},
			file{dir + "network_data.json", nd},
			file{dir + "vendor_data.json", vd},
		)
		if len(opts.UserData) > 0 {
			files = append(files, file{dir + "user_data", opts.UserData})
		}
	}
	if len(inst.Volumes) > 0 {
		files = append(files, file{VolumesFile, vl})
	}
	return files, nil
}

// Drive is one config drive image to build: Instance's drive, with
// Network's configuration (nil: none) and Options, written to Out. Dir is
// scratch space for the file tree (a temporary directory is made in it
// and removed).
type Drive struct {
	Dir, Out string
	Instance Instance
	Network  *Network
	Options  Options
}

// Build writes the config drive image to d.Out, replacing it atomically (a
// temporary file next to Out, then rename; Out's directory must exist).
// Options.Disabled is not looked at: the caller skips Build.
//
// Build validates d.Options (Options.Validate) and d.Instance (a uuid is
// required), then runs mkfs.vfat and mcopy (FormatVFAT) or genisoimage /
// xorriso (FormatISO9660). Bad input wraps errdefs.ErrInvalidArgument; a
// missing tool wraps errdefs.ErrNotFound.
func (d Drive) Build(ctx context.Context) (retErr error) {
	format, err := ParseFormat(string(d.Options.Format))
	if err != nil {
		return err
	}
	seed := make([]byte, randomSeedLen)
	if _, err = rand.Read(seed); err != nil {
		return fmt.Errorf("random seed: %w", err)
	}
	files, err := render(d.Instance, d.Network, d.Options, seed)
	if err != nil {
		return err
	}

	dir, err := filepath.Abs(d.Dir)
	if err != nil {
		return err
	}
	out, err := filepath.Abs(d.Out)
	if err != nil {
		return err
	}
	stage, err := os.MkdirTemp(dir, "configdrive-")
	if err != nil {
		return fmt.Errorf("config drive scratch dir: %w", err)
	}
	defer os.RemoveAll(stage)
	tree := filepath.Join(stage, "root")
	if err = writeTree(tree, files); err != nil {
		return err
	}

	tmpName, err := createImageFile(out, format)
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			os.Remove(tmpName)
		}
	}()
	job := mkfsJob{format: format, stage: stage, tree: tree, image: tmpName, uuid: d.Instance.UUID}
	if err = job.run(ctx); err != nil {
		return err
	}
	// Only root reads it until libvirt hands it to QEMU's user at start
	// (dynamic ownership, which the VM's writable overlay needs too): it
	// holds user-data, often passwords and keys.
	if err = os.Chmod(tmpName, 0o600); err != nil {
		return err
	}
	if err = os.Rename(tmpName, out); err != nil {
		return fmt.Errorf("config drive image: %w", err)
	}
	return nil
}

// writeTree writes the drive's files below tree.
func writeTree(tree string, files []file) error {
	for _, f := range files {
		p := filepath.Join(tree, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// createImageFile makes the temporary image file next to out, sized for
// a vfat drive (sparse), and returns its name; on error it is gone.
func createImageFile(out string, format Format) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return "", fmt.Errorf("config drive image: %w", err)
	}
	if format == FormatVFAT {
		err = tmp.Truncate(VFATSize)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("config drive image: %w", err)
	}
	return tmp.Name(), nil
}

// mkfsJob makes the file system of one drive image from its tree.
type mkfsJob struct {
	format Format
	stage  string // scratch dir, the tools' HOME
	tree   string // the drive's files
	image  string // the image file, made by createImageFile
	uuid   string // the instance's, from which the vfat serial comes
}

// run formats the image and copies the tree into it.
func (j mkfsJob) run(ctx context.Context) error {
	env := toolEnv(j.stage)
	switch j.format {
	case FormatVFAT:
		if err := run(ctx, env, "mkfs.vfat", "-n", Label, "-i", volumeID(j.uuid), j.image); err != nil {
			return err
		}
		// Every top-level directory (openstack/, and kvm/ with volumes).
		tops, err := os.ReadDir(j.tree)
		if err != nil {
			return err
		}
		args := []string{"-s", "-Q", "-i", j.image}
		for _, e := range tops {
			args = append(args, filepath.Join(j.tree, e.Name()))
		}
		return run(ctx, env, "mcopy", append(args, "::/")...)
	case FormatISO9660:
		tool, args, err := isoTool()
		if err != nil {
			return err
		}
		// nova's options: Rock Ridge and Joliet, ISO names relaxed so the
		// lower case, long and dotted names survive without them too.
		args = append(args, "-o", j.image, "-ldots", "-allow-lowercase", "-allow-multidot", "-l",
			"-publisher", "containerd-shim-kvm-v1", "-quiet", "-J", "-r", "-V", Label, j.tree)
		return run(ctx, env, tool, args...)
	}
	return nil
}

// volumeID derives the FAT volume serial (8 hex digits) from the uuid, so
// one instance's drives share it.
func volumeID(uuid string) string {
	sum := sha1.Sum([]byte(uuid))
	return fmt.Sprintf("%02x%02x%02x%02x", sum[0], sum[1], sum[2], sum[3])
}

// toolEnv is the whole environment of the tools: no user's mtools
// configuration, no locale surprises.
func toolEnv(home string) []string {
	return []string{
		"PATH=" + toolPath(),
		"HOME=" + home,
		"LC_ALL=C",
		"TZ=UTC",
		"MTOOLSRC=/dev/null",
		"MTOOLS_SKIP_CHECK=1",
	}
}

// toolPath is $PATH plus the sbin directories (mkfs.vfat is in /usr/sbin,
// which a daemon's PATH may lack).
func toolPath() string {
	p := os.Getenv("PATH")
	for _, d := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if !strings.Contains(":"+p+":", ":"+d+":") {
			p += ":" + d
		}
	}
	return strings.TrimPrefix(p, ":")
}

// lookTool finds name in toolPath.
func lookTool(name string) (string, error) {
	for _, d := range filepath.SplitList(toolPath()) {
		if d == "" {
			continue
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("config drive tool %s not found in %s: %w", name, toolPath(), errdefs.ErrNotFound)
}

// isoTool picks genisoimage, else xorriso as mkisofs, else mkisofs.
func isoTool() (string, []string, error) {
	if p, err := lookTool("genisoimage"); err == nil {
		return p, nil, nil
	}
	if p, err := lookTool("xorriso"); err == nil {
		return p, []string{"-as", "mkisofs"}, nil
	}
	if p, err := lookTool("mkisofs"); err == nil {
		return p, nil, nil
	}
	return "", nil, fmt.Errorf("config drive tool genisoimage, xorriso or mkisofs not found in %s: %w", toolPath(), errdefs.ErrNotFound)
}

// run executes tool with args (an argument vector, no shell) and returns
// an error with its output when it fails.
func run(ctx context.Context, env []string, tool string, args ...string) error {
	path := tool
	if !filepath.IsAbs(tool) {
		var err error
		if path, err = lookTool(tool); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	var output bytes.Buffer
	cmd.Stdout = &output
	cmd.Stderr = &output
	if err := childproc.Run(cmd); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("%s: %w", filepath.Base(path), errors.Join(ctxErr, err))
		}
		msg := strings.TrimSpace(output.String())
		if len(msg) > 1024 {
			msg = msg[:1024] + "..."
		}
		return fmt.Errorf("%s %s: %w: %s", filepath.Base(path), strings.Join(args, " "), err, msg)
	}
	return nil
}

// Package annotations is the one list of the kvm.containerd.io/*
// annotations the shim reads: their keys, which the code uses, and what
// each means, from which the reference in docs/annotations.md is generated
// (go generate ./annotations; a unit test fails while the page and the
// list differ). It has no dependencies, so a tool or an admission webhook
// can import it.
package annotations

//go:generate go run ../hack/annotationsdoc -o ../docs/annotations.md

// Prefix starts every key the shim reads; other keys under it are ignored.
const Prefix = "kvm.containerd.io/"

// The keys, each described in Reference.
const (
	VCPUs             = Prefix + "vcpus"
	Memory            = Prefix + "memory"
	KernelCmdline     = Prefix + "kernel-cmdline"
	NUMAMode          = Prefix + "numa-mode"
	MaxVCPUs          = Prefix + "max-vcpus"
	MaxMemoryMiB      = Prefix + "max-memory-mib"
	DiskImages        = Prefix + "disk-images"
	UserData          = Prefix + "user-data"
	UserDataBase64    = Prefix + "user-data-base64"
	SSHAuthorizedKeys = Prefix + "ssh-authorized-keys"
	Metadata          = Prefix + "metadata"
	ConfigDriveFormat = Prefix + "config-drive-format"
	ConfigDrive       = Prefix + "config-drive"
)

// Key is one annotation as the reference tells it (Markdown, links
// relative to docs/).
type Key struct {
	Name    string // the whole key
	Value   string // what a value looks like (the summary's column)
	Default string // what applies without it (the summary's column)
	Doc     string // its section
}

// Group is one section of the reference.
type Group struct {
	Title string
	Intro string
	Keys  []Key
}

// Reference lists every key, by section, in the reference's order.
var Reference = []Group{
	{
		Title: "Sizing and placement",
		Intro: "",
		Keys: []Key{
			{
				Name:    VCPUs,
				Value:   "whole number, 1 to `max_vcpus`",
				Default: "the spec's CPU limit rounded up (`linux.resources.cpu` quota/period), else `default_vcpus`",
				Doc: "The VM's vCPUs: a whole number (surrounding spaces ignored) from 1 to\n" +
					"`max_vcpus`. It wins over the OCI spec's CPU limit (quota/period rounded\n" +
					"up: `1500m` gives 2 vCPUs), which wins over `default_vcpus`. See\n" +
					"[resources.md](resources.md#sizing).",
			},
			{
				Name:    Memory,
				Value:   "size: `512Mi`, `2Gi`, `1G`, or bytes; rounded up to MiB; 64 MiB to `max_memory_mib`",
				Default: "the spec's memory limit (`linux.resources.memory.limit`), else `default_memory_mib`",
				Doc: "The guest's memory: a whole, positive number of bytes with an optional\n" +
					"suffix, `Ki`, `Mi`, `Gi`, `Ti` (powers of 1024) or `k`, `M`, `G`, `T`\n" +
					"(powers of 1000), rounded up to whole MiB; from 64 MiB to\n" +
					"`max_memory_mib`. It wins over the spec's memory limit, which wins over\n" +
					"`default_memory_mib`. With huge pages the result is rounded up to whole\n" +
					"pages.",
			},
			{
				Name:    KernelCmdline,
				Value:   "one line, at most 2048 bytes",
				Default: "`kernel_cmdline` (direct kernel boot only)",
				Doc: "The kernel command line of a direct kernel boot image (`/boot/vmlinuz*`),\n" +
					"replacing `kernel_cmdline` (default `console=ttyS0`): one line (no NUL, CR\n" +
					"or LF) of at most 2048 bytes, x86's `COMMAND_LINE_SIZE`. For a pod whose\n" +
					"network `ip=` can describe, the shim appends `ip=...` to it\n" +
					"([networking.md](networking.md)). A disk image boots its own bootloader\n" +
					"and ignores it.",
			},
			{
				Name:    NUMAMode,
				Value:   "`node`, `dedicated` or `none`",
				Default: "`numa_mode`",
				Doc: "`node` (the VM on one host NUMA node, its vCPUs floating over the node's\n" +
					"CPUs), `dedicated` (an exclusive host CPU per vCPU, emulator threads on\n" +
					"the node's shared CPUs) or `none` (no pinning). Default: `numa_mode`. See\n" +
					"[resources.md](resources.md#numa-placement).",
			},
			{
				Name: MaxVCPUs,
				Value: "whole number, the VM's vCPUs to `max_vcpus`: how many vCPUs it may grow to live " +
					"(not above its vCPUs in `numa-mode` `dedicated`)",
				Default: "`hotplug_max_vcpus`, or the VM's vCPUs if more",
				Doc: "How many vCPUs the VM may grow to while it runs (`Update`, CRI's\n" +
					"`UpdateContainerResources`): a whole number from the VM's starting vCPUs\n" +
					"to `max_vcpus`. Default: `hotplug_max_vcpus` (4), or the VM's vCPUs if\n" +
					"more. In `numa-mode` `dedicated` a value above the VM's vCPUs is refused\n" +
					"and the default is the VM's vCPUs (each vCPU holds its own host CPU). A VM\n" +
					"spread over NUMA nodes gets no vCPUs added live whatever it says (logged).\n" +
					"See [resources.md](resources.md#live-resize).",
			},
			{
				Name: MaxMemoryMiB,
				Value: "whole number of MiB, the VM's memory to `max_memory_mib`: how much memory it may grow to live " +
					"through virtio-mem (not above its memory in `numa-mode` `dedicated`; a VM spread over NUMA nodes gets none)",
				Default: "`hotplug_max_memory_mib`, or the VM's memory if more",
				Doc: "How much memory (MiB) the VM may grow to while it runs, through a\n" +
					"virtio-mem device: a whole number from the VM's memory to\n" +
					"`max_memory_mib`. Default: `hotplug_max_memory_mib` (0: no device), or the\n" +
					"VM's memory if more. `dedicated` as for `max-vcpus`; a VM spread over NUMA\n" +
					"nodes gets no virtio-mem device (logged).",
			},
		},
	},
	{
		Title: "Volumes",
		Intro: "",
		Keys: []Key{
			{
				Name:    DiskImages,
				Value:   "`<container path>=<size>[,...]`: create a sparse `disk.img` of that size on each empty volume (see [volumes.md](volumes.md))",
				Default: "none",
				Doc: "`<container path>=<size>[,<container path>=<size>...]`: create a sparse\n" +
					"raw `disk.img` of that size (sizes as for `memory`) at the root of each\n" +
					"named filesystem volume, which the VM then gets as a virtio disk. Each\n" +
					"path must be absolute (it is cleaned) and name a volume of the container.\n" +
					"Refused: a malformed entry or size, a path that names no volume, a size\n" +
					"larger than the volume's free space, a volume that is not empty\n" +
					"(`lost+found` aside) or is read-only. A volume that already holds a\n" +
					"`disk.img` keeps it, whatever the annotation says. See\n" +
					"[volumes.md](volumes.md).",
			},
		},
	},
	{
		Title: "Config drive",
		Intro: "These shape the OpenStack config drive\n" +
			"([config-drive.md](config-drive.md)).",
		Keys: []Key{
			{
				Name:    UserData,
				Value:   "cloud-init user-data, plain text, at most 64 KiB",
				Default: "none",
				Doc: "cloud-init (or cloudbase-init) user-data as plain text, at most 64 KiB;\n" +
					"written to `openstack/*/user_data`. Empty means none.",
			},
			{
				Name:    UserDataBase64,
				Value:   "the same, base64 (not together with `user-data`)",
				Default: "none",
				Doc: "The same, base64-encoded (standard alphabet, padding optional, white space\n" +
					"ignored), at most 64 KiB decoded: for user-data that is binary or hard to\n" +
					"quote. Giving both this and `user-data` (both non-empty) is refused.",
			},
			{
				Name:    SSHAuthorizedKeys,
				Value:   "OpenSSH public keys, one per line (at most 128; `command=` options refused)",
				Default: "none",
				Doc: "OpenSSH public keys, one per line (`type base64 [comment]`), at most 128\n" +
					"keys and 64 KiB; blank lines and lines starting with `#` are skipped. A\n" +
					"line with `authorized_keys` options (such as `command=`) is refused: give\n" +
					"the bare key. They become `meta_data.json` `public_keys` (and nova's\n" +
					"`keys` list), each named by the first word of its comment, or `key-N`\n" +
					"(counting from 1) when it has none or the name is taken.",
			},
			{
				Name:    Metadata,
				Value:   "JSON object of strings, merged into `meta_data.json` `meta` (at most 128 entries, 255 bytes each)",
				Default: "none",
				Doc: "A JSON object of strings (nothing after it), at most 256 KiB, 128 entries,\n" +
					"keys of 1 to 255 bytes and values of at most 255 bytes (nova's limits);\n" +
					"merged into `meta_data.json` `meta` beside the pod name, namespace, uid\n" +
					"and container name the shim adds.",
			},
			{
				Name:    ConfigDriveFormat,
				Value:   "`vfat` or `iso9660`",
				Default: "`config_drive_format`",
				Doc: "`vfat` (a read-only virtio disk, what Windows needs) or `iso9660` (a\n" +
					"read-only CD-ROM on virtio-scsi). Empty or absent: `config_drive_format`.",
			},
			{
				Name:    ConfigDrive,
				Value:   "`true` or `false`",
				Default: "`true`",
				Doc: "`true` or `false` (Go's `strconv.ParseBool`: also `1`, `0`, `t`, `f`,\n" +
					"`TRUE`, `False`, ...). Default `true`. `false` gives the VM no config\n" +
					"drive. In a pod with a network, a direct-boot guest whose network the\n" +
					"kernel's `ip=` cannot describe (more than one interface, IPv6, a gateway\n" +
					"outside the prefix) is then refused, and a disk-image guest boots with a\n" +
					"warning in the log that it gets no network configuration from the shim.",
			},
		},
	},
}

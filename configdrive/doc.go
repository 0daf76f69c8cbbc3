// Package configdrive writes OpenStack config drive images, so that
// unchanged OpenStack guest images (Linux with cloud-init, Windows with
// cloudbase-init) take their hostname, SSH keys, network and user-data from
// the pod that runs them.
//
// # The image
//
// Build writes a file system labelled "config-2" holding the layout nova
// writes (one dated version cloud-init knows and "latest"):
//
//	openstack/2018-08-27/meta_data.json
//	openstack/2018-08-27/network_data.json
//	openstack/2018-08-27/vendor_data.json
//	openstack/2018-08-27/user_data          (only when user-data was given)
//	openstack/latest/...                    (the same four files)
//	kvm/network                             (only with a network: GuestNetworkFile)
//	kvm/volumes                             (only with volumes, see VolumesFile)
//
// vendor_data.json is {} unless the pod has shared volumes: then its
// "cloud-init" key holds a cloud-config whose bootcmd mounts each virtiofs
// share at its container path.
//
// FormatVFAT (the default, and the one Windows needs) is a 64 MiB sparse
// FAT image made like nova makes it: `mkfs.vfat -n config-2` then
// `mcopy -s` (dosfstools, mtools). FormatISO9660 is made with
// `genisoimage -J -r -V config-2` (or `xorriso -as mkisofs`, same options).
// Tools run with argument vectors, never through a shell, and no path
// component comes from an annotation: the file names above are fixed.
//
// Attach the image read-only. The Debian cloud kernel has no AHCI driver,
// so a SATA cdrom is invisible to it: attach a vfat drive as a virtio disk,
// and an iso9660 drive as a virtio-scsi cdrom (both booted in
// hack/cloudimage; cloud-init finds the drive by its label). Rebuild it on
// every VM create:
// Build replaces the output atomically (temporary file + rename).
//
// # Inputs
//
// Instance carries what the shim knows of the VM (StableUUID gives the
// per-VM uuid: the same pod uid and container name always give the same
// uuid, so cloud-init sees the same instance across restarts). Network
// models nova's network_data.json; NewNetwork builds it from a pod
// interface's MAC, MTU, addresses, routes and DNS servers, AddLink adds
// the next interface (link ids interface0, interface1, ... in order), and
// ParseResolvConf reads the servers and search domains from the pod's
// resolv.conf. Options carries what the pod's user asked for;
// FromAnnotations reads it from the pod annotations below and enforces
// every limit, with errors wrapping errdefs.ErrInvalidArgument that name
// the annotation (all of them are checked even when the drive is
// disabled). Build renders and writes the image (about 7 ms for vfat).
//
// A typical create path:
//
//	opts, err := configdrive.FromAnnotations(pod.Annotations, cfg.ConfigDriveFormat)
//	if err != nil { return err } // InvalidArgument, names the annotation
//	if !opts.Disabled {
//		servers, search := configdrive.ParseResolvConf(resolvConf)
//		nw, err := configdrive.NewNetwork(eth0MAC, eth0MTU, eth0Addrs, routes, servers)
//		if err != nil { return err }
//		nw.Search = search
//		inst := configdrive.Instance{
//			UUID: configdrive.StableUUID(podUID, containerName),
//			Name: podName, AvailabilityZone: cfg.AvailabilityZone,
//		}
//		err = configdrive.Drive{
//			Dir: stateDir, Out: filepath.Join(stateDir, "config-drive.img"),
//			Instance: inst, Network: nw, Options: opts,
//		}.Build(ctx)
//	}
//
// # Annotations
//
// All keys are under "kvm.containerd.io/":
//
//	key                   value                                   limit / default
//	user-data             user-data as plain text                 <= 64 KiB; empty = none
//	user-data-base64      user-data, base64 (standard alphabet,   <= 64 KiB decoded; not together
//	                      padding optional, whitespace ignored)   with user-data
//	ssh-authorized-keys   OpenSSH public keys, one per line       <= 128 keys, 64 KiB; blank lines
//	                      ("type base64 [comment]"); lines        and # comments skipped; options
//	                      starting with # are comments            (command=...) rejected
//	metadata              JSON object, string -> string, merged   <= 128 entries, key and value
//	                      into meta_data.json "meta"              <= 255 bytes each (nova's limits)
//	config-drive-format   "vfat" or "iso9660"                     default: the shim's configuration
//	config-drive          "true" or "false" (strconv.ParseBool)   default true; false = no drive
//
// Each key's name in meta_data.json "public_keys" is its comment (the
// first word of it), or "key-N" (N counting from 1) when it has none or the
// name is already taken.
//
// # meta_data.json and network_data.json
//
// meta_data.json has the keys nova writes that guests use: uuid, name,
// hostname, launch_index, availability_zone (when set), public_keys (a map:
// cloud-init reads "public_keys", not "public-keys", from version 2 drives),
// keys (nova's list form, read by cloudbase-init), meta, random_seed
// (512 random bytes, base64; cloud-init feeds them to /dev/urandom) and
// instance_type (when known).
//
// network_data.json follows nova's schema: links (type "phy",
// ethernet_mac_address, mtu), networks (one per static address: type "ipv4"
// or "ipv6", ip_address, netmask, routes with network/netmask/gateway, link,
// network_id, services) and services (type "dns", address). The one
// addition is "search" on the first dns service (Network.Search), which
// cloud-init turns into search domains and other readers ignore. A route
// via 0.0.0.0 or :: is on-link: cloud-init renders it without a gateway,
// which is how a /32 pod reaches a gateway outside its prefix.
//
// kvm/network carries the same network as lines a shell reads without a
// JSON parser, for guests without cloud-init (renderGuestNetwork has the
// format).
//
// # Proofs
//
// The tests run the real readers when they are installed: fsck.fat -n,
// mdir and mtype (vfat), isoinfo (iso9660), blkid, and Debian's cloud-init
// (its ConfigDrive data source over the drive's files, and
// `cloud-init devel net-convert --kind network_data.json` to netplan,
// networkd and ENI). hack/cloudimage boots a Debian cloud-init guest with
// a drive from Build and checks hostname, keys, network and user-data.
package configdrive

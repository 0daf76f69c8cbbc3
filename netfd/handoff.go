package netfd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// SocketDir holds one socket per VM with a network, named <domain>.sock.
// The dir is root's and only searchable; each socket belongs to the QEMU
// user alone. The emulator wrapper, which libvirt runs as that user,
// connects by the domain name it finds in its own command line.
const SocketDir = "/run/containerd-shim-kvm-v1/netfd"

// MaxDescriptors is how many descriptors one grant may carry: the
// kernel's limit for one SCM_RIGHTS message (SCM_MAX_FD).
const MaxDescriptors = 253

// SocketPath is where the shim serves the descriptors of a domain.
func SocketPath(dir, domain string) string { return filepath.Join(dir, domain+".sock") }

// Grant is sent with the descriptors: what the wrapper appends to QEMU's
// command line. The descriptors follow NIC by NIC, in order: that NIC's
// Queues TAP queues, then its VhostFDs vhost-net descriptors (0 or Queues).
type Grant struct {
	QEMU string `json:"qemu"` // the real emulator to exec
	NICs []NIC  `json:"nics"`
}

// NIC is one guest NIC: a pod interface's TAP behind a virtio-net device.
type NIC struct {
	NetdevID string `json:"netdevID"`
	MAC      string `json:"mac"`
	Queues   int    `json:"queues"`
	VhostFDs int    `json:"vhostFDs"`
	Bus      string `json:"bus"`  // e.g. pcie.0
	Addr     string `json:"addr"` // a PCI slot libvirt leaves free, e.g. 0x10
}

// descriptors is how many descriptors the grant carries.
func (g Grant) descriptors() int {
	n := 0
	for _, nic := range g.NICs {
		n += nic.Queues + nic.VhostFDs
	}
	return n
}

// QEMUArgs returns the -netdev and -device arguments of every NIC for
// the received descriptor numbers (in the grant's order).
func (g Grant) QEMUArgs(fds []int) []string {
	var args []string
	for _, nic := range g.NICs {
		tap, vhost := fds[:nic.Queues], fds[nic.Queues:nic.Queues+nic.VhostFDs]
		fds = fds[nic.Queues+nic.VhostFDs:]
		args = append(args, nic.qemuArgs(tap, vhost)...)
	}
	return args
}

func (nic NIC) qemuArgs(tapFDs, vhostFDs []int) []string {
	netdev := []string{"tap", "id=" + nic.NetdevID, "fds=" + joinInts(tapFDs)}
	if len(vhostFDs) > 0 {
		netdev = append(netdev, "vhost=on", "vhostfds="+joinInts(vhostFDs))
	}
	dev := []string{"virtio-net-pci", "netdev=" + nic.NetdevID, "id=" + nic.NetdevID + "-dev", "mac=" + nic.MAC,
		"bus=" + nic.Bus, "addr=" + nic.Addr}
	if len(tapFDs) > 1 {
		// Two vectors per queue pair plus config and control.
		dev = append(dev, "mq=on", "vectors="+strconv.Itoa(2*len(tapFDs)+2))
	}
	return []string{"-netdev", strings.Join(netdev, ","), "-device", strings.Join(dev, ",")}
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ":")
}

// NICFiles are the descriptors of one NIC: its TAP queues and, with
// vhost-net, one vhost descriptor per queue.
type NICFiles struct {
	TAP, Vhost []*os.File
}

// Close closes all of them.
func (f NICFiles) Close() {
	closeFiles(f.TAP)
	closeFiles(f.Vhost)
}

// Provider opens the descriptors for one connection of the VM's wrapper,
// one NICFiles per NIC of the grant, in its order. The server closes them
// once sent.
type Provider func() (g Grant, files []NICFiles, err error)

// Server hands a VM's network descriptors to that VM's emulator wrapper,
// and to nobody else: the peer must run as the QEMU user, be the process
// libvirt started for the domain (its pid file, when libvirt has written
// it), and carry the domain's name on its command line.
type Server struct {
	domain  string
	path    string
	qemuUID int
	pidDir  string
	provide Provider
	onPeer  func(pid int) error // see WithPeerHook; nil for none
	l       *net.UnixListener
	wg      sync.WaitGroup
}

// ServeOption changes what Serve does for each connection.
type ServeOption func(*Server)

// WithPeerHook has hook run with the pid of each authorized peer (the
// wrapper, before it execs QEMU) before the descriptors are sent; an error
// refuses them, so the wrapper fails and the domain does not start.
func WithPeerHook(hook func(pid int) error) ServeOption {
	return func(s *Server) { s.onPeer = hook }
}

// ServerConfig is what a Server hands out and to whom.
type ServerConfig struct {
	Dir, Domain      string // the socket is SocketPath(Dir, Domain)
	QEMUUID, QEMUGID int    // the socket's owner: the QEMU user of the domain
	PIDDir           string // where libvirt writes the domain's QEMU pid
	Provide          Provider
}

// Serve listens at SocketPath(c.Dir, c.Domain) until Close. It serves
// every connection, so a restarted domain gets fresh descriptors.
func (c ServerConfig) Serve(ctx context.Context, opts ...ServeOption) (*Server, error) {
	dir, domain, qemuUID, qemuGID := c.Dir, c.Domain, c.QEMUUID, c.QEMUGID
	// The dirs are root's and only searchable by others: the QEMU user
	// reaches its sockets by name but can neither list them nor remove or
	// replace one (another VM's QEMU runs as the same user).
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
		if err := os.Chown(d, os.Geteuid(), os.Getegid()); err != nil {
			return nil, fmt.Errorf("take %s: %w", d, err)
		}
		if err := os.Chmod(d, 0o711); err != nil {
			return nil, err
		}
	}
	path := SocketPath(dir, domain)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale %s: %w", path, err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chown(path, qemuUID, qemuGID); err != nil {
		l.Close()
		return nil, fmt.Errorf("give %s to the QEMU user: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	s := &Server{domain: domain, path: path, qemuUID: qemuUID, pidDir: c.PIDDir, provide: c.Provide, l: l}
	for _, o := range opts {
		o(s)
	}
	s.wg.Add(1)
	go s.accept(ctx)
	return s, nil
}

// Close stops serving and removes the socket.
func (s *Server) Close() error {
	err := s.l.Close()
	s.wg.Wait()
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (s *Server) accept(ctx context.Context) {
	defer s.wg.Done()
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			return
		}
		if err := s.serve(c); err != nil {
			log.G(ctx).WithError(err).WithField("vm", s.domain).Warn("refused network descriptors")
		}
		c.Close()
	}
}

func (s *Server) serve(c *net.UnixConn) error {
	pid, err := s.authorize(c)
	if err != nil {
		return err
	}
	if s.onPeer != nil {
		if err = s.onPeer(pid); err != nil {
			return err
		}
	}
	g, files, err := s.provide()
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if len(files) != len(g.NICs) {
		return fmt.Errorf("descriptors for %d NICs, the grant has %d", len(files), len(g.NICs))
	}
	var fds []int
	for i, f := range files {
		g.NICs[i].Queues, g.NICs[i].VhostFDs = len(f.TAP), len(f.Vhost)
		for _, file := range append(append([]*os.File{}, f.TAP...), f.Vhost...) {
			fds = append(fds, int(file.Fd()))
		}
	}
	if len(fds) > MaxDescriptors {
		return fmt.Errorf("%d descriptors for %d NICs; one message carries at most %d", len(fds), len(files), MaxDescriptors)
	}
	hdr, err := json.Marshal(g)
	if err != nil {
		return err
	}
	if _, _, err := c.WriteMsgUnix(hdr, unix.UnixRights(fds...), nil); err != nil {
		return fmt.Errorf("send descriptors: %w", err)
	}
	return nil
}

// peerCred returns the credentials of the process on the other end of c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred, nil
}

// authorize checks who is on the other end of c and returns its pid.
func (s *Server) authorize(c *net.UnixConn) (int, error) {
	cred, err := peerCred(c)
	if err != nil {
		return 0, err
	}
	if int(cred.Uid) != s.qemuUID {
		return 0, fmt.Errorf("peer pid %d runs as uid %d, not the QEMU user %d", cred.Pid, cred.Uid, s.qemuUID)
	}
	// libvirt writes the pid file before the process it forked may exec
	// (it holds it at a handshake until then), so the QEMU it starts always
	// finds it. Without one, no QEMU of this domain runs: refuse, since the
	// command line below is the peer's to choose.
	pidFile := filepath.Join(s.pidDir, s.domain+".pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, fmt.Errorf("peer pid %d: no QEMU of %s runs: %w", cred.Pid, s.domain, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("peer pid %d: pid file %s: %w", cred.Pid, pidFile, err)
	}
	if pid != int(cred.Pid) {
		return 0, fmt.Errorf("peer pid %d is not the process libvirt started for %s (pid %d)", cred.Pid, s.domain, pid)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid))
	if err != nil {
		return 0, fmt.Errorf("read command line of peer pid %d: %w", cred.Pid, err)
	}
	if DomainFromArgs(strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")) != s.domain {
		return 0, fmt.Errorf("peer pid %d does not name domain %s on its command line", cred.Pid, s.domain)
	}
	return pid, nil
}

// DomainFromArgs finds the domain name in a QEMU command line as libvirt
// writes it: -name guest=<name>,debug-threads=on (commas in the name are
// doubled).
func DomainFromArgs(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] != "-name" {
			continue
		}
		v := args[i+1]
		rest, ok := strings.CutPrefix(v, "guest=")
		if !ok {
			return strings.SplitN(v, ",", 2)[0]
		}
		var b strings.Builder
		for j := 0; j < len(rest); j++ {
			if rest[j] == ',' {
				if j+1 < len(rest) && rest[j+1] == ',' {
					b.WriteByte(',')
					j++
					continue
				}
				break
			}
			b.WriteByte(rest[j])
		}
		return b.String()
	}
	return ""
}

// Fetch is the wrapper's side: it connects to the domain's socket and
// receives the grant and the descriptors (in the grant's order), made
// inheritable for exec.
func Fetch(path string) (Grant, []int, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return Grant{}, nil, fmt.Errorf("connect to %s: %w", path, err)
	}
	defer c.Close()
	// Only the shim (root) hands out descriptors and names the emulator.
	if cred, peerCredErr := peerCred(c); peerCredErr != nil {
		return Grant{}, nil, fmt.Errorf("%s: %w", path, peerCredErr)
	} else if cred.Uid != 0 {
		return Grant{}, nil, fmt.Errorf("%s is served by uid %d, not root", path, cred.Uid)
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*MaxDescriptors))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return Grant{}, nil, fmt.Errorf("receive descriptors: %w", err)
	}
	var fds []int
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return Grant{}, nil, fmt.Errorf("parse descriptors: %w", err)
	}
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return Grant{}, nil, fmt.Errorf("parse descriptors: %w", err)
		}
		fds = append(fds, got...)
	}
	var g Grant
	if err := json.Unmarshal(buf[:n], &g); err != nil {
		return Grant{}, nil, fmt.Errorf("parse grant: %w", err)
	}
	for _, nic := range g.NICs {
		if nic.Queues < 1 || (nic.VhostFDs != 0 && nic.VhostFDs != nic.Queues) {
			closeFDs(fds)
			return Grant{}, nil, fmt.Errorf("NIC %s: %d queues and %d vhost descriptors", nic.NetdevID, nic.Queues, nic.VhostFDs)
		}
	}
	if len(g.NICs) == 0 || len(fds) != g.descriptors() {
		closeFDs(fds)
		return Grant{}, nil, fmt.Errorf("got %d descriptors for %d NICs that need %d", len(fds), len(g.NICs), g.descriptors())
	}
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return Grant{}, nil, fmt.Errorf("make descriptor %d inheritable: %w", fd, err)
		}
	}
	return g, fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

package configdrive

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/kvm-shim/containerd-shim-kvm-v1/annotations"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// Test keys (made with ssh-keygen for these tests; the private halves were
// thrown away).
const (
	testKeyEd25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAeH9QSmKyJOekqxgvXkUnZ4Wut4vJ4VMkxqvdjJcu/n alice@example"
	testKeyRSA     = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQClONsJkvjcW3CyP5robsyActkQzuTLqvjMwOi73GoIEJM1c11Z9EbhrfdpJ+AAFq4DNeps" +
		"/shUoe2uLfO6O+3yVPjIFAkcbaVcfhPN1UhtNfjDrwXnij+VpG39QaPXLwp2C4eRIDidailhfgZp8MKRO76l5JFHlZYYZ43B7P+tYw=="
	testMAC = "52:54:00:12:34:56"
)

// testInstance, testNetwork and testOptions are the "typical" drive used by
// the golden files, the tool tests and the benchmarks.
func testInstance() Instance {
	return Instance{
		UUID:             StableUUID("6f0e6c3a-6d1b-4c1e-9d6e-0a1b2c3d4e5f", "vm"),
		Name:             "web-0",
		AvailabilityZone: "zone-a",
		InstanceType:     "2c-1g",
		Volumes:          testVolumes(),
	}
}

func testNetwork(t testing.TB) *Network {
	t.Helper()
	mac, err := net.ParseMAC(testMAC)
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNetwork(mac, 1450,
		[]netip.Prefix{netip.MustParsePrefix("10.244.1.23/24"), netip.MustParsePrefix("fd00:10:244:1::17/64")},
		[]Route{
			{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gateway: netip.MustParseAddr("10.244.1.1")},
			{Dst: netip.MustParsePrefix("::/0"), Gateway: netip.MustParseAddr("fd00:10:244:1::1")},
			{Dst: netip.MustParsePrefix("192.168.50.0/24"), Gateway: netip.MustParseAddr("10.244.1.254")},
		},
		[]netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")})
	if err != nil {
		t.Fatal(err)
	}
	n.Search = []string{"default.svc.cluster.local", "svc.cluster.local", "cluster.local"}
	return n
}

const testUserData = "#!/bin/sh\necho configdrive-user-data-ran > /run/configdrive-marker\n"

func testOptions(t testing.TB) Options {
	t.Helper()
	o, err := FromAnnotations(map[string]string{
		annotations.UserData:          testUserData,
		annotations.SSHAuthorizedKeys: testKeyEd25519 + "\n\n# a comment\n" + testKeyRSA + "\n",
		annotations.Metadata:          `{"role": "web", "team": "blue"}`,
	}, FormatVFAT)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (go test -update rewrites it):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestMetaDataGolden(t *testing.T) {
	md, err := renderMetaData(testInstance(), testOptions(t), []byte("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "meta_data.json", md)

	// The fields cloud-init and cloudbase-init read, by their exact names.
	var m map[string]any
	if err := json.Unmarshal(md, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"uuid", "hostname", "name", "public_keys", "keys", "launch_index", "availability_zone", "meta", "instance_type",
		"random_seed"} {
		if _, ok := m[k]; !ok {
			t.Errorf("meta_data.json lacks %q", k)
		}
	}
	if _, ok := m["public-keys"]; ok {
		t.Error(`meta_data.json has "public-keys"; version 2 readers want "public_keys"`)
	}
	if _, ok := m["public_keys"].(map[string]any); !ok {
		t.Errorf("public_keys is %T, want an object", m["public_keys"])
	}
}

func TestMetaDataMinimal(t *testing.T) {
	md, err := renderMetaData(Instance{UUID: "u-1", Name: "Pod.Name"}, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "meta_data_minimal.json", md)
	if _, err := renderMetaData(Instance{Name: "x"}, Options{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no uuid: err = %v, want InvalidArgument", err)
	}
	for _, h := range []string{"web-0", "web-0.example.com", "A1"} {
		if _, err := renderMetaData(Instance{UUID: "u", Hostname: h}, Options{}, nil); err != nil {
			t.Errorf("hostname %q: %v", h, err)
		}
	}
	for _, h := range []string{"-web", "web_0", "a..b", "web.", strings.Repeat("a", 64), "a b", "ü"} {
		if _, err := renderMetaData(Instance{UUID: "u", Hostname: h}, Options{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("hostname %q: err = %v, want InvalidArgument", h, err)
		}
	}
}

func TestNetworkDataGolden(t *testing.T) {
	nd, err := renderNetworkData(testNetwork(t))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "network_data.json", nd)

	nd, err = renderNetworkData(nil)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "network_data_empty.json", nd)
}

func TestNewNetworkErrors(t *testing.T) {
	mac, _ := net.ParseMAC(testMAC)
	v4 := []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}
	for _, tc := range []struct {
		name   string
		mac    net.HardwareAddr
		mtu    int
		addrs  []netip.Prefix
		routes []Route
	}{
		{"no mac", nil, 1500, v4, nil},
		{"infiniband mac", make(net.HardwareAddr, 20), 1500, v4, nil},
		{"negative mtu", mac, -1, v4, nil},
		{"v6 route without v6 address", mac, 0, v4, []Route{{netip.MustParsePrefix("::/0"), netip.MustParseAddr("fd00::1")}}},
		{"route without gateway", mac, 0, v4, []Route{{Dst: netip.MustParsePrefix("0.0.0.0/0")}}},
		{"invalid address", mac, 0, []netip.Prefix{{}}, nil},
		{"mapped address", mac, 0, []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.2/120")}, nil},
	} {
		if _, err := NewNetwork(tc.mac, tc.mtu, tc.addrs, tc.routes, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want InvalidArgument", tc.name, err)
		}
	}
}

func TestParseResolvConf(t *testing.T) {
	servers, search := ParseResolvConf([]byte(`# pod resolv.conf
domain old.example
search default.svc.cluster.local svc.cluster.local cluster.local # trailing
nameserver 10.96.0.10
nameserver fe80::1%eth0
nameserver not-an-address
nameserver ::ffff:10.0.0.53
nameserver fd00::a
options ndots:5
`))
	want := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.0.0.53"), netip.MustParseAddr("fd00::a")}
	if len(servers) != len(want) {
		t.Fatalf("servers = %v, want %v", servers, want)
	}
	for i := range want {
		if servers[i] != want[i] {
			t.Errorf("servers[%d] = %v, want %v", i, servers[i], want[i])
		}
	}
	if got := strings.Join(search, " "); got != "default.svc.cluster.local svc.cluster.local cluster.local" {
		t.Errorf("search = %q", got)
	}
}

func TestSanitizeHostname(t *testing.T) {
	for in, want := range map[string]string{
		"web-0":                        "web-0",
		"Web.Example.COM":              "web-example-com",
		"my_pod__name":                 "my-pod-name",
		"-leading-trailing-":           "leading-trailing",
		"":                             "vm",
		"...":                          "vm",
		"äöü":                          "vm",
		"ab\x00cd":                     "ab-cd",
		"node1":                        "node1",
		"123":                          "123",
		strings.Repeat("a", 70):        strings.Repeat("a", 63),
		strings.Repeat("a", 62) + ".b": strings.Repeat("a", 62),
		strings.Repeat("ab", 30) + "-----" + "xyz":       strings.Repeat("ab", 30) + "-xy",
		"statefulset-with-a-very-long-name-0123456789-x": "statefulset-with-a-very-long-name-0123456789-x",
	} {
		got := SanitizeHostname(in)
		if got != want {
			t.Errorf("SanitizeHostname(%q) = %q, want %q", in, got, want)
		}
		if !isRFC1123Label(got) {
			t.Errorf("SanitizeHostname(%q) = %q is not an RFC 1123 label", in, got)
		}
	}
}

func isRFC1123Label(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

func TestStableUUID(t *testing.T) {
	a := StableUUID("6f0e6c3a-6d1b-4c1e-9d6e-0a1b2c3d4e5f", "vm")
	if a != StableUUID("6f0e6c3a-6d1b-4c1e-9d6e-0a1b2c3d4e5f", "vm") {
		t.Error("StableUUID is not stable")
	}
	if a == StableUUID("6f0e6c3a-6d1b-4c1e-9d6e-0a1b2c3d4e5f", "vm2") || a == StableUUID("other", "vm") {
		t.Error("StableUUID collides for different inputs")
	}
	if len(a) != 36 || a[14] != '5' || !strings.ContainsRune("89ab", rune(a[19])) {
		t.Errorf("StableUUID = %s, want a version 5, RFC 4122 variant uuid", a)
	}
}

func TestRenderLayout(t *testing.T) {
	files, err := render(testInstance(), testNetwork(t), testOptions(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, f.path)
	}
	want := "kvm/network openstack/2018-08-27/meta_data.json openstack/2018-08-27/network_data.json openstack/2018-08-27/vendor_data.json " +
		"openstack/2018-08-27/user_data " +
		"openstack/latest/meta_data.json openstack/latest/network_data.json openstack/latest/vendor_data.json openstack/latest/user_data " +
		"kvm/volumes"
	if got := strings.Join(paths, " "); got != want {
		t.Errorf("files = %s\nwant    %s", got, want)
	}
	// No user-data, no user_data file; no network, no kvm/network.
	files, err = render(testInstance(), nil, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f.path, "user_data") || f.path == GuestNetworkFile {
			t.Errorf("%s written without user-data or network", f.path)
		}
	}
}

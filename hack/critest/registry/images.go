package main

import (
	"runtime"
	"strconv"
)

// The repositories of the CRI conformance suite's images, as critest
// v1.34.0 names them (pkg/framework/util.go, pkg/validate/consts.go,
// multi_container_linux.go, security_context_linux.go), without their
// registry host: containerd's hosts configuration sends every host to
// this registry. e2e is the prefix of the e2e test images, staging that
// of cri-tools' own.
const (
	e2e     = "e2e-test-images/"
	staging = "k8s-staging-cri-tools/"
	// PauseRef is the sandbox image the harness configures containerd with.
	pauseRef = "kvm-shim-critest/pause:1"
)

// file is one file an image adds to the base layer.
type file struct {
	path string
	src  string // a host file, copied; or
	data string // literal content
	mode int64
}

// image is one image of the suite: its tags (repository:tag, all naming the
// same image), what it adds to the busybox base, and its config.
type image struct {
	refs  []string
	files []file
	cmd   []string
	user  string
}

// bins are the host paths of the programs the images carry.
type bins struct {
	busybox, procps, webserver, nonewprivs, pause string
}

// server describes one web server image: its tag, the name the server
// runs and logs under, the port, where it writes its pid ("" for
// nowhere), and arguments it ignores but shows in its command line.
type server struct {
	ref, name, bin string
	port           int
	pidFile        string
	extra          []string
}

// webServer is an image whose command is the web server, as the suite's
// nginx and httpd images are.
func webServer(s server) image {
	cmd := []string{"/usr/sbin/" + s.name, "-listen=:" + strconv.Itoa(s.port), "-name=" + s.name}
	if s.pidFile != "" {
		cmd = append(cmd, "-pidfile="+s.pidFile)
	}
	return image{
		refs:  []string{s.ref},
		files: []file{{path: "/usr/sbin/" + s.name, src: s.bin, mode: 0o755}},
		cmd:   append(cmd, s.extra...),
	}
}

// marked is a busybox image told apart from the others by one file.
func marked(mark string, refs ...string) image {
	return image{
		refs:  refs,
		files: []file{{path: "/" + mark, data: mark + "\n", mode: 0o644}},
		cmd:   []string{"sh"},
	}
}

// predefinedGroup is the image whose default user belongs to a group
// defined only in the image's /etc/group (SupplementalGroupsPolicy specs).
func predefinedGroup() image {
	return image{
		refs: []string{staging + "test-image-predefined-group:latest"},
		files: []file{
			{path: "/etc/passwd", data: passwd + "default-user:x:1000:1000:Linux User,,,:/home/default-user:/bin/sh\n", mode: 0o644},
			{path: "/etc/group", data: group + "default-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n", mode: 0o644},
		},
		cmd:  []string{"sh"},
		user: "1000",
	}
}

// suiteImages lists every image critest v1.34.0 pulls, but the one it names
// by a digest of the upstream build (test-image-digest@sha256:...): no
// image built here can have that digest.
func suiteImages(b bins) []image {
	nginxArgs := []string{"master process"} // /proc/1/cmdline as nginx's reads
	return []image{
		{refs: []string{e2e + "busybox:1.29-2"}, cmd: []string{"sh"}},
		webServer(server{e2e + "nginx:1.14-2", "nginx", b.webserver, 80, "/var/run/nginx.pid", nginxArgs}),
		webServer(server{e2e + "httpd:2.4.39-4", "httpd", b.webserver, 80, "", nil}),
		webServer(server{staging + "hostnet-nginx-" + runtime.GOARCH + ":latest", "nginx", b.webserver, 12003, "/var/run/nginx.pid", nginxArgs}),
		{
			refs:  []string{e2e + "nonewprivs:1.3"},
			files: []file{{path: "/usr/local/bin/nnp", src: b.nonewprivs, mode: 0o4755}},
			cmd:   []string{"/usr/local/bin/nnp"},
		},
		marked("test-image-latest", staging+"test-image-latest:latest"),
		marked("test-image-tag", staging+"test-image-tag:test"),
		marked("test-image-tag-all", staging+"test-image-tag:all"),
		marked("test-image-1", staging+"test-image-1:latest"),
		marked("test-image-2", staging+"test-image-2:latest"),
		marked("test-image-3", staging+"test-image-3:latest"),
		marked("test-image-tags", staging+"test-image-tags:1", staging+"test-image-tags:2", staging+"test-image-tags:3"),
		{refs: []string{staging + "test-image-user-uid:latest"}, cmd: []string{"sh"}, user: "1002"},
		{refs: []string{staging + "test-image-user-username:latest"}, cmd: []string{"sh"}, user: "www-data"},
		{refs: []string{staging + "test-image-user-uid-group:latest"}, cmd: []string{"sh"}, user: "1003:100"},
		{refs: []string{staging + "test-image-user-username-group:latest"}, cmd: []string{"sh"}, user: "www-data:www-data"},
		predefinedGroup(),
		{
			refs:  []string{pauseRef},
			files: []file{{path: "/pause", src: b.pause, mode: 0o755}},
			cmd:   []string{"/pause"},
		},
	}
}

// The base layer's account files: those of a busybox image, with the
// users the suite names (www-data, nobody).
const (
	passwd = "root:x:0:0:root:/root:/bin/sh\n" +
		"daemon:x:1:1:daemon:/usr/sbin:/bin/false\n" +
		"www-data:x:33:33:www-data:/var/www:/bin/false\n" +
		"nobody:x:65534:65534:nobody:/home:/bin/false\n"
	group = "root:x:0:\n" +
		"daemon:x:1:\n" +
		"www-data:x:33:\n" +
		"users:x:100:\n" +
		"nogroup:x:65534:\n"
)

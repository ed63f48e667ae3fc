package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/space-sandbox/space/internal/spacedtest"
	"github.com/space-sandbox/space/pkg/client"
)

// busyboxImage is an image the test makes itself: static busybox with a few applets, an env,
// a working directory.
func busyboxImage(t *testing.T) v1.Image {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	add(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
	for _, a := range []string{"sh", "cat", "echo", "pwd", "mkdir", "ls", "id", "stat"} {
		add(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	add(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/srv:/bin/sh\n"))
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:\napp:x:1000:\n"))
	add(&tar.Header{Name: "srv/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}, nil)
	add(&tar.Header{Name: "srv/from-image.txt", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("image file\n"))
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "GREETING=from-image"}
	cf.Config.WorkingDir = "/srv"
	cf.Config.User = "1000" // numeric, as images often give it
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestTemplateFromImage: a template from an image in a registry on loopback, plus a step.
func TestTemplateFromImage(t *testing.T) {
	d := startSpaced(t)
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, err := name.ParseReference(host+"/demo/busybox:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, busyboxImage(t)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	tpl, err := d.Client.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "from-image", From: client.BuildFrom{Image: ref.String()},
		Steps: []client.BuildStep{{Run: "echo built > built.txt"}}}, nil)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if tpl.Parent != ref.String() {
		t.Fatalf("parent %q", tpl.Parent)
	}
	sb := create(t, d.Client, client.CreateSandboxRequest{Template: "from-image"})
	res := run(t, d.Client, sb.ID, "cat from-image.txt built.txt; echo $GREETING; pwd; id -un; stat -c %U built.txt")
	if res.Stdout != "image file\nbuilt\nfrom-image\n/srv\napp\napp\n" {
		t.Fatalf("sandbox from the image: %+v", res)
	}

	check := func(what, image string, status int) {
		t.Helper()
		_, err := d.Client.BuildTemplate(ctx, client.BuildTemplateRequest{Name: "bad", From: client.BuildFrom{Image: image}}, nil)
		var e *client.Error
		if err == nil || !asClientError(err, &e) || e.Status != status {
			t.Fatalf("%s: %v, want status %d", what, err, status)
		}
	}
	check("missing image", host+"/demo/nothing:1", 404)
	closed, err := spacedtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	check("unreachable registry", closed+"/demo/busybox:1", 502)
	list, _ := d.Client.ListTemplates(ctx)
	for _, tp := range list {
		if tp.Name == "bad" {
			t.Fatalf("a failed build left a template: %+v", list)
		}
	}
}

func asClientError(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}

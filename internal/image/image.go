// Package image turns an OCI or Docker image — from a registry, an OCI layout directory or a
// `docker save` tarball — into a plain root filesystem directory, plus the bits of its config a
// sandbox needs (environment, working directory, user, entrypoint). It owns image resolution,
// registry access and the safe application of layer tarballs; it does not cache or store
// anything. Imported by the template builder; it imports nothing of SPACE but errdefs.
package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/space-sandbox/space/internal/errdefs"
)

// The only platform SPACE runs: an index resolves to this manifest.
const (
	platformOS   = "linux"
	platformArch = "amd64"
)

// Source names where an image comes from. Exactly one field must be set.
type Source struct {
	Ref     string // registry reference, e.g. 127.0.0.1:5000/x:tag or debian:bookworm
	Layout  string // path of an OCI image layout directory (index.json, blobs/)
	Tarball string // path of a `docker save` tarball holding exactly one image
}

func (s Source) String() string {
	switch {
	case s.Ref != "":
		return s.Ref
	case s.Layout != "":
		return "oci-layout:" + s.Layout
	default:
		return "docker-archive:" + s.Tarball
	}
}

// Config is what a sandbox takes from the image config.
type Config struct {
	Env        []string // KEY=value, in image order
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
	Digest     string // digest of the (platform-specific) image manifest, e.g. sha256:…
}

// Options tunes Unpack. The zero value is usable.
type Options struct {
	// Keychain supplies registry credentials; nil means authn.DefaultKeychain, which reads the
	// usual Docker config file ($DOCKER_CONFIG/config.json or ~/.docker/config.json).
	Keychain authn.Keychain
	// Progress, if set, receives one human-readable line per step, e.g.
	// "pulling layer 2/5 sha256:abcd… (12.3 MiB)". It is called from Unpack's goroutine.
	Progress func(msg string)
	// Logger receives debug detail and skipped entries (device nodes); nil discards.
	Logger *slog.Logger
}

// Unpack resolves src (an index resolves to its linux/amd64 image), applies the image's layers
// in order into dest and returns the image config.
//
// dest must be an existing empty directory. Layers are applied as Docker does: whiteouts
// (.wh.<name>) delete, .wh..wh..opq makes a directory opaque, and modes, ownership (when the
// process may chown), mtimes, symlinks, hardlinks and FIFOs are kept; device nodes are skipped and
// logged. No entry may write outside dest: absolute names, names that climb out with "..",
// hardlinks to outside, and paths through a symlink that leads out of dest (or is absolute) are
// refused with an error naming the entry and wrapping errdefs.ErrInvalidArgument.
//
// On error dest holds a partial tree that must not be used: the caller deletes dest. Errors are
// classified: an unknown image, layout or tarball wraps errdefs.ErrNotFound; an unreachable
// registry (refused, DNS, TLS, dial timeout of a few seconds) errdefs.ErrUnavailable; a
// registry's 401/403 errdefs.ErrPermissionDenied; a malformed reference or bad dest
// errdefs.ErrInvalidArgument.
func Unpack(ctx context.Context, src Source, dest string, opts Options) (Config, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	if err := checkDest(dest); err != nil {
		return Config{}, err
	}

	img, classify, cleanup, err := resolve(ctx, src, opts)
	if err != nil {
		return Config{}, err
	}
	defer cleanup()

	progress(fmt.Sprintf("resolving %s", src))
	cfg, err := imageConfig(img, src)
	if err != nil {
		return Config{}, classify(err)
	}
	layers, err := img.Layers()
	if err != nil {
		return Config{}, classify(err)
	}

	//confine:host dest is the empty directory the caller made; entries go through os.Root beneath it
	root, err := os.OpenRoot(dest)
	if err != nil {
		return Config{}, fmt.Errorf("open %s: %w", dest, err)
	}
	defer root.Close()
	a := &applier{root: root, log: log, chown: true}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return Config{}, err
		}
		if err := unpackLayer(ctx, a, l, i, len(layers), progress, classify); err != nil {
			return Config{}, err
		}
	}
	if a.skipped > 0 {
		log.Info("image: skipped device nodes", "image", src.String(), "count", a.skipped)
	}
	progress(fmt.Sprintf("unpacked %d layers of %s", len(layers), src))
	return cfg, nil
}

// unpackLayer streams layer i (0-based) of n into a.
func unpackLayer(ctx context.Context, a *applier, l v1.Layer, i, n int, progress func(string), classify func(error) error) error {
	digest, err := l.Digest()
	if err != nil {
		return classify(err)
	}
	size, err := l.Size()
	if err != nil {
		return classify(err)
	}
	progress(fmt.Sprintf("pulling layer %d/%d %s (%s)", i+1, n, shortDigest(digest.String()), humanSize(size)))

	rc, err := l.Uncompressed()
	if err != nil {
		return classify(err)
	}
	src := &readRecorder{r: rc}
	applyErr := a.applyLayer(ctx, src)
	if applyErr == nil {
		// Read to the end so that the digest check of the blob runs, then surface its verdict.
		_, applyErr = io.Copy(io.Discard, src)
	}
	closeErr := rc.Close()
	switch {
	case src.err != nil:
		// The stream itself failed (network, gzip, digest mismatch): that is the cause.
		return fmt.Errorf("layer %d/%d %s: %w", i+1, n, digest, classify(src.err))
	case applyErr != nil:
		return fmt.Errorf("layer %d/%d %s: %w", i+1, n, digest, applyErr)
	case closeErr != nil:
		return fmt.Errorf("layer %d/%d %s: %w", i+1, n, digest, classify(closeErr))
	}
	return nil
}

// readRecorder remembers the first read error other than io.EOF, so that a failure to fetch or
// decompress a layer is told apart from a bad entry in it.
type readRecorder struct {
	r   io.Reader
	err error
}

func (r *readRecorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && r.err == nil {
		r.err = err
	}
	return n, err
}

// checkDest insists on an existing, empty directory.
func checkDest(dest string) error {
	//confine:host dest is the empty directory the caller made
	f, err := os.Open(dest)
	if err != nil {
		return errdefs.InvalidArgument(fmt.Sprintf("unpack destination %s: %v", dest, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat %s: %w", dest, err)
	}
	if !fi.IsDir() {
		return errdefs.InvalidArgument(fmt.Sprintf("unpack destination %s is not a directory", dest))
	}
	names, err := f.Readdirnames(1)
	if err != nil && err != io.EOF {
		return fmt.Errorf("read %s: %w", dest, err)
	}
	if len(names) > 0 {
		return errdefs.Conflict(fmt.Sprintf("unpack destination %s is not empty", dest))
	}
	return nil
}

// resolve finds the image src names. classify turns errors met while reading the image into
// SPACE's error classes; cleanup releases connections.
func resolve(ctx context.Context, src Source, opts Options) (img v1.Image, classify func(error) error, cleanup func(), err error) {
	set := 0
	for _, s := range []string{src.Ref, src.Layout, src.Tarball} {
		if s != "" {
			set++
		}
	}
	if set != 1 {
		return nil, nil, nil, errdefs.InvalidArgument("image source: set exactly one of reference, layout and tarball")
	}
	switch {
	case src.Ref != "":
		return remoteImage(ctx, src.Ref, opts)
	case src.Layout != "":
		img, err := layoutImage(src.Layout)
		return img, localClassifier(src), func() {}, err
	default:
		img, err := tarballImage(src.Tarball)
		return img, localClassifier(src), func() {}, err
	}
}

// localClassifier wraps errors from a local image, which are about its content.
func localClassifier(src Source) func(error) error {
	return func(err error) error {
		if hasClass(err) {
			return err
		}
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.NotFound(fmt.Sprintf("image %s is incomplete: %v", src, err))
		}
		return errdefs.InvalidArgument(fmt.Sprintf("image %s: %v", src, err))
	}
}

func statSource(kind, p string, wantDir bool) error {
	//confine:host an image source the administrator named (archive or layout), not an unpacked tree
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return errdefs.NotFound(fmt.Sprintf("%s %s not found", kind, p))
	}
	if err != nil {
		return errdefs.InvalidArgument(fmt.Sprintf("%s %s: %v", kind, p, err))
	}
	if fi.IsDir() != wantDir {
		return errdefs.InvalidArgument(fmt.Sprintf("%s %s: wrong file type", kind, p))
	}
	return nil
}

func layoutImage(dir string) (v1.Image, error) {
	if err := statSource("OCI layout", dir, true); err != nil {
		return nil, err
	}
	if err := statSource("OCI layout index", filepath.Join(dir, "index.json"), false); err != nil {
		return nil, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("OCI layout %s: %v", dir, err))
	}
	img, err := pickImage(idx, 0)
	if err != nil {
		return nil, fmt.Errorf("OCI layout %s: %w", dir, err)
	}
	return img, nil
}

// pickImage returns the first linux/amd64 image of idx, descending into nested indexes. An
// entry without a platform is taken if its config does not name another platform.
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errdefs.InvalidArgument("image indexes nested too deeply")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("read index: %v", err))
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && (d.Platform.OS != platformOS || d.Platform.Architecture != platformArch) {
			continue
		}
		switch {
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, errdefs.InvalidArgument(fmt.Sprintf("read image %s: %v", d.Digest, err))
			}
			if d.Platform == nil {
				if cf, err := img.ConfigFile(); err != nil || checkPlatform(cf) != nil {
					continue
				}
			}
			return img, nil
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, errdefs.InvalidArgument(fmt.Sprintf("read index %s: %v", d.Digest, err))
			}
			if img, err := pickImage(child, depth+1); err == nil {
				return img, nil
			}
		}
	}
	return nil, errdefs.NotFound(fmt.Sprintf("no %s/%s image in index", platformOS, platformArch))
}

func tarballImage(p string) (v1.Image, error) {
	if err := statSource("image tarball", p, false); err != nil {
		return nil, err
	}
	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		return nil, errdefs.InvalidArgument(fmt.Sprintf("image tarball %s: %v", p, err))
	}
	return img, nil
}

// checkPlatform refuses an image built for another platform; an unset field is accepted.
func checkPlatform(cf *v1.ConfigFile) error {
	if (cf.OS != "" && cf.OS != platformOS) || (cf.Architecture != "" && cf.Architecture != platformArch) {
		return errdefs.InvalidArgument(fmt.Sprintf("image is for %s/%s, not %s/%s", cf.OS, cf.Architecture, platformOS, platformArch))
	}
	return nil
}

func imageConfig(img v1.Image, src Source) (Config, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, err
	}
	if err := checkPlatform(cf); err != nil {
		return Config{}, errdefs.InvalidArgument(fmt.Sprintf("image %s: %v", src, err))
	}
	digest, err := img.Digest()
	if err != nil {
		return Config{}, err
	}
	return Config{
		Env:        cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
		Digest:     digest.String(),
	}, nil
}

// shortDigest abbreviates sha256:<64 hex> to sha256:<12 hex>….
func shortDigest(d string) string {
	const keep = len("sha256:") + 12
	if len(d) <= keep {
		return d
	}
	return d[:keep] + "…"
}

// humanSize formats n bytes with binary units and one decimal, e.g. 12.3 MiB.
func humanSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB"} {
		v /= unit
		if v < unit || u == "GiB" {
			return fmt.Sprintf("%.1f %s", v, u)
		}
	}
	return "" // unreachable
}

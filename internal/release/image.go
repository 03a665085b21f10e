package release

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's shape: the static binary alone on an empty base (no shell, no package manager,
// no base image to pin or patch; TLS roots are compiled in), run as a non-root user whose home
// is the only directory it owns, and /tmp.
const (
	ImageBinary = "/usr/local/bin/ghcrsync"
	ImageUser   = "65532:65532"
	imageUID    = 65532
)

// ImageEnv is the image's environment.
var ImageEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/nonroot"}

// ImageSource is where the image's labels point.
type ImageSource struct {
	Version, Commit, Repository string
}

// ImageIndex is the multi-platform OCI image of the linux binaries (platform "linux/amd64" ->
// the binary built for it). Every byte follows from the binaries, the source and mtime: the
// same build gives the same digests.
func ImageIndex(binaries map[string]string, src ImageSource, mtime time.Time) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)

	platforms := make([]string, 0, len(binaries))
	for p := range binaries {
		platforms = append(platforms, p)
	}

	slices.Sort(platforms)

	for _, p := range platforms {
		plat, err := v1.ParsePlatform(p)
		if err != nil || plat.OS != "linux" {
			return nil, fmt.Errorf("image: %q is not a linux platform", p)
		}

		img, err := platformImage(binaries[p], *plat, src, mtime)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", p, err)
		}

		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}

	return idx, nil
}

// Image writes ImageIndex as an OCI image layout archive (oci-archive: skopeo copies it to a
// registry, `ctr images import` loads it) at path, its index.json naming the image index by
// the version. It returns the image index's digest.
func Image(path string, binaries map[string]string, src ImageSource, mtime time.Time) (v1.Hash, error) {
	idx, err := ImageIndex(binaries, src, mtime)
	if err != nil {
		return v1.Hash{}, err
	}

	dir, err := os.MkdirTemp(filepath.Dir(path), ".image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(dir)

	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, err
	}

	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": src.Version})); err != nil {
		return v1.Hash{}, err
	}

	if err := archiveDir(path, dir, mtime); err != nil {
		return v1.Hash{}, err
	}

	return idx.Digest()
}

func platformImage(binary string, plat v1.Platform, src ImageSource, mtime time.Time) (v1.Image, error) {
	tarBytes, err := imageLayer(binary, mtime)
	if err != nil {
		return nil, err
	}

	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarBytes)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}

	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, err
	}

	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}

	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Variant = plat.OS, plat.Architecture, plat.Variant
	cfg.Created = v1.Time{Time: mtime.UTC()}
	cfg.History = nil
	cfg.Config = v1.Config{
		User:       ImageUser,
		Env:        ImageEnv,
		Entrypoint: []string{ImageBinary},
		Labels: map[string]string{
			"org.opencontainers.image.title":    "ghcrsync",
			"org.opencontainers.image.version":  src.Version,
			"org.opencontainers.image.revision": src.Commit,
			"org.opencontainers.image.source":   src.Repository,
			"org.opencontainers.image.licenses": "Apache-2.0",
		},
	}

	return mutate.ConfigFile(img, cfg)
}

// imageLayer is the image's one layer, a reproducible tar (dated mtime): the folders a nonroot
// user needs and the binary at ImageBinary.
func imageLayer(binary string, mtime time.Time) ([]byte, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}

	var buf bytes.Buffer

	tw := tar.NewWriter(&buf)
	for _, d := range []struct {
		name     string
		mode     int64
		uid, gid int
	}{
		{"home/", 0o755, 0, 0}, {"home/nonroot/", 0o700, imageUID, imageUID}, {"tmp/", 0o1777, 0, 0},
		{"usr/", 0o755, 0, 0}, {"usr/local/", 0o755, 0, 0}, {"usr/local/bin/", 0o755, 0, 0},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: d.name, Typeflag: tar.TypeDir, Mode: d.mode, Uid: d.uid, Gid: d.gid,
			ModTime: mtime.UTC(), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}

	if err := tw.WriteHeader(&tar.Header{Name: ImageBinary[1:], Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(b)), ModTime: mtime.UTC(), Format: tar.FormatPAX}); err != nil {
		return nil, err
	}

	if _, err := tw.Write(b); err != nil {
		return nil, err
	}

	if err := tw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// archiveDir writes the files under dir as a reproducible tar (sorted, owned by root, dated
// mtime) at path.
func archiveDir(path, dir string, mtime time.Time) error {
	var files []File

	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}

		rel, err := filepath.Rel(dir, p)
		files = append(files, File{Path: p, Name: filepath.ToSlash(rel), Mode: 0o644})

		return err
	})
	if err != nil {
		return err
	}

	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Name, b.Name) })

	var buf bytes.Buffer
	if err := writeTar(&buf, files, mtime); err != nil {
		return err
	}

	return os.WriteFile(path, buf.Bytes(), 0o644)
}

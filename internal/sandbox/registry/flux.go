package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"slices"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Flux's OCI artifact, as `flux push artifact` writes it and source-controller reads it: an OCI
// manifest whose config is Flux's and whose one layer is the files, a gzipped tar.
const (
	FluxConfigMediaType  types.MediaType = "application/vnd.cncf.flux.config.v1+json"
	FluxContentMediaType types.MediaType = "application/vnd.cncf.flux.content.v1.tar+gzip"
)

// FluxArtifact is the files (path → content) of the cluster's desired state a Flux artifact
// carries.
type FluxArtifact map[string]string

// PushFluxArtifact pushes files as a Flux OCI artifact under image ("org/name:tag"), private
// unless its org is public; the same files give the same digest (dated at the epoch, sorted).
// It returns the manifest's digest.
func (r *Registry) PushFluxArtifact(image, source string, files FluxArtifact) (string, error) {
	tgz, err := tarGzip(files)
	if err != nil {
		return "", err
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, FluxConfigMediaType)

	if img, err = mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(tgz, FluxContentMediaType)}); err != nil {
		return "", err
	}

	img, _ = mutate.Annotations(img, map[string]string{
		"org.opencontainers.image.source":  source,
		"org.opencontainers.image.created": time.Unix(0, 0).UTC().Format(time.RFC3339),
	}).(v1.Image)

	if err := r.write(image, func(ref name.Reference) error { return remote.Write(ref, img) }); err != nil {
		return "", err
	}

	d, err := img.Digest()

	return d.String(), err
}

// tarGzip is files as a reproducible gzipped tar: sorted, root-owned, dated at the epoch.
func tarGzip(files FluxArtifact) ([]byte, error) {
	var buf bytes.Buffer

	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)

	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}

	slices.Sort(paths)

	for _, p := range paths {
		body := []byte(files[p])
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}

		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}

	if err := tw.Close(); err != nil {
		return nil, err
	}

	if err := zw.Close(); err != nil {
		return nil, err
	}

	return buf.Bytes(), nil
}

// Package release packages built binaries for publication, so that a team can publish its own
// build from its fork: reproducible archives (the same bytes from the same binaries, whatever
// the machine or the hour), a SHA256SUMS file, and an in-toto statement of SLSA provenance
// naming what was built, from which commit, by which workflow run. The SBOM is made by a
// separate generator (scripts/release.sh); this package only counts it among the subjects.
package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// File is one file put in an archive: where it is, its name in the archive, its mode.
type File struct {
	Path string
	Name string
	Mode int64
}

// Archive writes a reproducible .tar.gz of files to path: entries in the given order, owned by
// root, dated mtime (the commit's time: SOURCE_DATE_EPOCH), with no gzip name or time. The
// same files give the same bytes.
func Archive(path string, files []File, mtime time.Time) error {
	var buf bytes.Buffer

	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}

	if err := writeTar(zw, files, mtime); err != nil {
		return fmt.Errorf("archive %s: %w", filepath.Base(path), err)
	}

	if err := zw.Close(); err != nil {
		return err
	}

	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// writeTar writes files to w as a tar: entries in the given order, owned by root, dated mtime.
func writeTar(w io.Writer, files []File, mtime time.Time) error {
	tw := tar.NewWriter(w)

	for _, f := range files {
		b, err := os.ReadFile(f.Path)
		if err != nil {
			return err
		}

		h := &tar.Header{Name: f.Name, Mode: f.Mode, Size: int64(len(b)), ModTime: mtime.UTC(), Typeflag: tar.TypeReg,
			Format: tar.FormatPAX, Uname: "root", Gname: "root"}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}

		if _, err := tw.Write(b); err != nil {
			return err
		}
	}

	return tw.Close()
}

// Subject is a published file and its SHA-256.
type Subject struct {
	Name   string `json:"name"`
	Digest Digest `json:"digest"`
}

// Digest is a subject's digests by algorithm.
type Digest struct {
	SHA256 string `json:"sha256,omitempty"`
	// GitCommit is a source revision's (resolved dependencies).
	GitCommit string `json:"gitCommit,omitempty"`
}

// Subjects are the SHA-256 of the files named, in dir, sorted by name.
func Subjects(dir string, names []string) ([]Subject, error) {
	out := make([]Subject, 0, len(names))

	for _, n := range names {
		f, err := os.Open(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}

		h := sha256.New()
		_, err = io.Copy(h, f)
		_ = f.Close()

		if err != nil {
			return nil, err
		}

		out = append(out, Subject{Name: n, Digest: Digest{SHA256: hex.EncodeToString(h.Sum(nil))}})
	}

	return sortedByName(out), nil
}

func sortedByName(subjects []Subject) []Subject {
	out := slices.Clone(subjects)
	slices.SortFunc(out, func(a, b Subject) int { return strings.Compare(a.Name, b.Name) })

	return out
}

// Checksums is the SHA256SUMS file of subjects, by name, in sha256sum's format (sha256sum
// --check reads it).
func Checksums(subjects []Subject) []byte {
	var b strings.Builder

	for _, s := range sortedByName(subjects) {
		fmt.Fprintf(&b, "%s  %s\n", s.Digest.SHA256, s.Name)
	}

	return []byte(b.String())
}

// Command ghcrsync-release packages the binaries `make release` built (scripts/release.sh):
// a reproducible .tar.gz per platform, the multi-platform image of the linux ones (an OCI
// archive), the provenance statement of what was built, and the SHA256SUMS of everything
// published. It builds nothing and publishes nothing.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/clock"
	"github.com/ghcrsync/ghcrsync/internal/release"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ghcrsync-release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}

	mtime, err := sourceDate()
	if err != nil {
		return err
	}

	platforms, err := o.archives(mtime)
	if err != nil {
		return err
	}

	if err := o.image(platforms, mtime); err != nil {
		return err
	}

	return o.provenance(platforms)
}

// options are the release's flags.
type options struct {
	dist, bins, version, repo, commit, extra string
	started                                  int64
}

func parseFlags(args []string) (options, error) {
	var o options

	fs := flag.NewFlagSet("ghcrsync-release", flag.ContinueOnError)
	fs.StringVar(&o.dist, "dist", "dist", "the folder published: archives, SBOM, provenance, SHA256SUMS")
	fs.StringVar(&o.bins, "binaries", "dist/bin", "the folder of built binaries, one per platform, named ghcrsync_VERSION_OS_ARCH")
	fs.StringVar(&o.version, "version", "", "the version stamped in the binaries")
	fs.StringVar(&o.repo, "repository", "", "the source repository's URI (git+https://github.com/OWNER/NAME)")
	fs.StringVar(&o.commit, "commit", "", "the commit built")
	fs.Int64Var(&o.started, "started", 0, "when the build started (Unix seconds)")
	fs.StringVar(&o.extra, "docs", "LICENSE,README.md", "files put in every archive beside the binary")

	if err := fs.Parse(args); err != nil {
		return o, err
	}

	if o.version == "" || o.commit == "" {
		return o, fmt.Errorf("--version and --commit are required (scripts/release.sh passes them)")
	}

	return o, nil
}

// archives writes one archive per built binary (the binary and the docs beside it) and returns
// their platforms (os/arch).
func (o options) archives(mtime time.Time) ([]string, error) {
	entries, err := os.ReadDir(o.bins)
	if err != nil {
		return nil, fmt.Errorf("the built binaries: %w (run make release)", err)
	}

	var platforms []string

	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "ghcrsync_"+o.version+"_") {
			continue
		}

		files := []release.File{{Path: filepath.Join(o.bins, name), Name: "ghcrsync", Mode: 0o755}}
		for _, d := range strings.Split(o.extra, ",") {
			files = append(files, release.File{Path: d, Name: filepath.Base(d), Mode: 0o644})
		}

		if err := release.Archive(filepath.Join(o.dist, name+".tar.gz"), files, mtime); err != nil {
			return nil, err
		}

		osArch := strings.TrimPrefix(name, "ghcrsync_"+o.version+"_")
		platforms = append(platforms, strings.Replace(osArch, "_", "/", 1))
	}

	if len(platforms) == 0 {
		return nil, fmt.Errorf("no binary ghcrsync_%s_* in %s (run make release)", o.version, o.bins)
	}

	return platforms, nil
}

// image writes the linux binaries, one platform each, as an OCI archive beside the archives.
func (o options) image(platforms []string, mtime time.Time) error {
	linux := map[string]string{}

	for _, p := range platforms {
		if strings.HasPrefix(p, "linux/") {
			linux[p] = filepath.Join(o.bins, "ghcrsync_"+o.version+"_"+strings.Replace(p, "/", "_", 1))
		}
	}

	if len(linux) == 0 {
		return nil
	}

	src := release.ImageSource{Version: o.version, Commit: o.commit, Repository: o.repo}
	_, err := release.Image(filepath.Join(o.dist, "ghcrsync_"+o.version+"_image.oci.tar"), linux, src, mtime)

	return err
}

// provenance writes the build's provenance statement over everything published, and SHA256SUMS.
func (o options) provenance(platforms []string) error {
	published, err := publishedFiles(o.dist)
	if err != nil {
		return err
	}

	subjects, err := release.Subjects(o.dist, published)
	if err != nil {
		return err
	}

	stmt := release.NewStatement(subjects, release.Build{
		Version: o.version, Platforms: platforms, GoVersion: runtime.Version(),
		Repository: o.repo, Commit: o.commit, BuilderID: builderID(), InvocationID: invocationID(),
		Started: time.Unix(o.started, 0), Finished: clock.System.Now(),
	})

	js, err := stmt.JSON()
	if err != nil {
		return err
	}

	provenance := "ghcrsync_" + o.version + ".intoto.jsonl"
	if err := os.WriteFile(filepath.Join(o.dist, provenance), js, 0o644); err != nil {
		return err
	}

	// The archives and the SBOM are hashed once, for the provenance: only the statement is added.
	stated, err := release.Subjects(o.dist, []string{provenance})
	if err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(o.dist, "SHA256SUMS"), release.Checksums(append(subjects, stated...)), 0o644)
}

// publishedFiles are the regular files of dist but SHA256SUMS and provenance: the archives and
// the SBOM.
func publishedFiles(dist string) ([]string, error) {
	entries, err := os.ReadDir(dist)
	if err != nil {
		return nil, err
	}

	var names []string

	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && n != "SHA256SUMS" && !strings.HasSuffix(n, ".intoto.jsonl") {
			names = append(names, n)
		}
	}

	return names, nil
}

// sourceDate is SOURCE_DATE_EPOCH (the commit's time): the archives' dates.
func sourceDate() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0), nil
	}

	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q is not Unix seconds", s)
	}

	return time.Unix(n, 0), nil
}

// builderID is the GitHub Actions workflow that builds, when one does.
func builderID() string {
	if os.Getenv("GITHUB_ACTIONS") != "true" {
		return ""
	}

	return os.Getenv("GITHUB_SERVER_URL") + "/" + os.Getenv("GITHUB_WORKFLOW_REF")
}

// invocationID is the workflow run's address, when one builds.
func invocationID() string {
	if os.Getenv("GITHUB_ACTIONS") != "true" {
		return ""
	}

	return os.Getenv("GITHUB_SERVER_URL") + "/" + os.Getenv("GITHUB_REPOSITORY") + "/actions/runs/" +
		os.Getenv("GITHUB_RUN_ID") + "/attempts/" + os.Getenv("GITHUB_RUN_ATTEMPT")
}

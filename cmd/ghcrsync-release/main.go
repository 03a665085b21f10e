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
	fs := flag.NewFlagSet("ghcrsync-release", flag.ContinueOnError)
	dist := fs.String("dist", "dist", "the folder published: archives, SBOM, provenance, SHA256SUMS")
	bins := fs.String("binaries", "dist/bin", "the folder of built binaries, one per platform, named ghcrsync_VERSION_OS_ARCH")
	version := fs.String("version", "", "the version stamped in the binaries")
	repo := fs.String("repository", "", "the source repository's URI (git+https://github.com/OWNER/NAME)")
	commit := fs.String("commit", "", "the commit built")
	started := fs.Int64("started", 0, "when the build started (Unix seconds)")
	extra := fs.String("docs", "LICENSE,README.md", "files put in every archive beside the binary")

	if err := fs.Parse(args); err != nil {
		return err
	}

	if *version == "" || *commit == "" {
		return fmt.Errorf("--version and --commit are required (scripts/release.sh passes them)")
	}

	mtime, err := sourceDate()
	if err != nil {
		return err
	}

	entries, err := os.ReadDir(*bins)
	if err != nil {
		return fmt.Errorf("the built binaries: %w (run make release)", err)
	}

	var platforms []string

	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "ghcrsync_"+*version+"_") {
			continue
		}

		files := []release.File{{Path: filepath.Join(*bins, name), Name: "ghcrsync", Mode: 0o755}}
		for _, d := range strings.Split(*extra, ",") {
			files = append(files, release.File{Path: d, Name: filepath.Base(d), Mode: 0o644})
		}

		if err := release.Archive(filepath.Join(*dist, name+".tar.gz"), files, mtime); err != nil {
			return err
		}

		osArch := strings.TrimPrefix(name, "ghcrsync_"+*version+"_")
		platforms = append(platforms, strings.Replace(osArch, "_", "/", 1))
	}

	if len(platforms) == 0 {
		return fmt.Errorf("no binary ghcrsync_%s_* in %s (run make release)", *version, *bins)
	}

	// The image: the linux binaries, one platform each, as an OCI archive beside the archives.
	linux := map[string]string{}

	for _, p := range platforms {
		if strings.HasPrefix(p, "linux/") {
			linux[p] = filepath.Join(*bins, "ghcrsync_"+*version+"_"+strings.Replace(p, "/", "_", 1))
		}
	}

	if len(linux) > 0 {
		src := release.ImageSource{Version: *version, Commit: *commit, Repository: *repo}
		if _, err := release.Image(filepath.Join(*dist, "ghcrsync_"+*version+"_image.oci.tar"), linux, src, mtime); err != nil {
			return err
		}
	}

	published, err := publishedFiles(*dist)
	if err != nil {
		return err
	}

	subjects, err := release.Subjects(*dist, published)
	if err != nil {
		return err
	}

	stmt := release.NewStatement(subjects, release.Build{
		Version: *version, Platforms: platforms, GoVersion: runtime.Version(),
		Repository: *repo, Commit: *commit, BuilderID: builderID(), InvocationID: invocationID(),
		Started: time.Unix(*started, 0), Finished: clock.System.Now(),
	})

	js, err := stmt.JSON()
	if err != nil {
		return err
	}

	provenance := "ghcrsync_" + *version + ".intoto.jsonl"
	if err := os.WriteFile(filepath.Join(*dist, provenance), js, 0o644); err != nil {
		return err
	}

	// The archives and the SBOM are hashed once, for the provenance: only the statement is added.
	stated, err := release.Subjects(*dist, []string{provenance})
	if err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(*dist, "SHA256SUMS"), release.Checksums(append(subjects, stated...)), 0o644)
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

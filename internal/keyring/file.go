package keyring

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/credential"
)

// MaxFile bounds what is read of a config.json: a keyring is a few entries.
const MaxFile = 1 << 20

// Do is the writer's work on the keyring in root (the kubelet's root directory as mounted):
// read it, merge the entry of dockerconfigjson for registry in (ModeWrite), take the registry's
// entries out (ModeRemove) or only report (ModeRead); a change is written atomically (a temporary
// file in the same folder, fsync, rename), mode 0600 like the file containerd's credential is in.
// The report names nodePath, the file as the node sees it.
func Do(root string, mode Mode, registry string, dockerconfigjson []byte, nodePath string) (Report, error) {
	path := filepath.Join(root, File)

	// Read without moving the file's access time: the proof takes an access after the last
	// change for the kubelet's read (Await), and a writer's own read must not pass for it.
	current, err := readNoAtime(path)

	switch {
	case errors.Is(err, fs.ErrNotExist):
		current = nil
	case err != nil:
		return Report{}, fmt.Errorf("read %s: %w", nodePath, err)
	}

	var (
		out []byte
		r   Report
	)

	switch mode {
	case ModeAwait:
		return Report{}, fmt.Errorf("%s: await is not a change (Await)", nodePath)
	case ModeRead:
		r, err = Read(current, registry)
	case ModeRemove:
		if current == nil {
			return Report{Path: nodePath}, nil
		}

		out, r, err = Remove(current, registry)
	case ModeWrite:
		var entry []byte

		if entry, err = entryOf(dockerconfigjson, registry); err == nil {
			out, r, err = Merge(current, registry, entry)
		}
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}

	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", nodePath, err)
	}

	r.Path = nodePath

	if out != nil && r.Changed {
		if err := atomicfile.Write(path, out, 0o600); err != nil {
			return Report{}, fmt.Errorf("write %s: %w", nodePath, err)
		}
	}

	if st, err := os.Stat(path); err == nil {
		r.Written = modTime(st)
	}

	return r, nil
}

// Await waits, up to within, polling every poll, until the keyring in root is read after its last
// change (ModeAwait): its access time passes its change time, which on a file system mounted
// relatime (Linux's default, Talos's /var among them) the first read after a change does. What it
// holds for registry is read first with O_NOATIME, so that this read does not count. A keyring
// not read within is reported with no ReadAt; one that is gone is an error.
func Await(root, registry, nodePath string, within, poll time.Duration) (Report, error) {
	path := filepath.Join(root, File)

	current, err := readNoAtime(path)
	if err != nil {
		return Report{}, fmt.Errorf("read %s: %w", nodePath, err)
	}

	r, err := Read(current, registry)
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", nodePath, err)
	}

	r.Path = nodePath
	deadline := time.Now().Add(within)

	for {
		st, err := os.Stat(path)
		if err != nil {
			return Report{}, fmt.Errorf("%s: %w", nodePath, err)
		}

		r.Written = modTime(st)

		if at := accessTime(st); at.After(r.Written) {
			r.ReadAt = at

			return r, nil
		}

		if time.Now().After(deadline) {
			return r, nil
		}

		time.Sleep(poll)
	}
}

// entryOf is the registry's entry of a dockerconfigjson (the writer's Secret), as the keyring
// holds it.
func entryOf(dockerconfigjson []byte, registry string) ([]byte, error) {
	if len(dockerconfigjson) == 0 {
		return nil, errors.New("no credential was given (the writer reads it from its Secret, in " + EntryEnv + ")")
	}

	c, err := credential.Parse(dockerconfigjson, registry)
	if err != nil {
		return nil, fmt.Errorf("the credential given: %w", err)
	}

	return Entry(c.Username, c.Password()), nil
}

func modTime(st fs.FileInfo) time.Time { return st.ModTime().UTC() }

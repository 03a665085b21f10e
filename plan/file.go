package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// fileFormat names the saved-plan envelope.
const fileFormat = "ghcrsync-plan"

// ErrCorrupt is returned for a plan file that does not verify.
var ErrCorrupt = errors.New("the plan file is corrupt or was edited")

type envelope struct {
	Format   string          `json:"format"`
	Checksum string          `json:"checksum"`
	Plan     json.RawMessage `json:"plan"`
}

// Save writes the plan with a checksum, 0600, atomically (temp file, fsync, rename).
func Save(path string, p *Plan) error {
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}

	sum := sha256.Sum256(body)

	data, err := json.MarshalIndent(envelope{Format: fileFormat, Checksum: "sha256:" + hex.EncodeToString(sum[:]), Plan: body}, "", "  ")
	if err != nil {
		return err
	}

	return writeAtomic(path, append(data, '\n'))
}

// Load reads and verifies a saved plan.
func Load(path string) (*Plan, error) {
	data, err := readlimit.File(path, readlimit.Plan)
	if err != nil {
		return nil, fmt.Errorf("read plan file %s: %w; run `ghcrsync plan --out %s` again", path, err, path)
	}

	return Decode(data, path)
}

// Decode verifies and reads a saved plan's bytes; path names it in errors.
func Decode(data []byte, path string) (*Plan, error) {
	corrupt := func(why string) error {
		return fmt.Errorf("%w (%s: %s); run `ghcrsync plan --out %s` again", ErrCorrupt, path, why, path)
	}

	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, corrupt("not a plan file")
	}

	if env.Format != fileFormat {
		return nil, corrupt("not a plan file")
	}

	var compact bytes.Buffer
	if err := json.Compact(&compact, env.Plan); err != nil {
		return nil, corrupt("plan body is not JSON")
	}

	sum := sha256.Sum256(compact.Bytes())
	if env.Checksum != "sha256:"+hex.EncodeToString(sum[:]) {
		return nil, corrupt("checksum mismatch")
	}

	var p Plan
	if err := json.Unmarshal(compact.Bytes(), &p); err != nil {
		return nil, corrupt(err.Error())
	}

	if major, _, _ := strings.Cut(p.FormatVersion, "."); major != "1" {
		return nil, fmt.Errorf("plan file %s has format_version %s; this ghcrsync reads 1.x: run plan again with this version", path, p.FormatVersion)
	}

	return &p, nil
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}

	defer os.Remove(tmp.Name())

	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()

		return err
	}

	if _, err := tmp.Write(data); err != nil {
		tmp.Close()

		return err
	}

	if err := tmp.Sync(); err != nil {
		tmp.Close()

		return err
	}

	if err := tmp.Close(); err != nil {
		return err
	}

	return os.Rename(tmp.Name(), path)
}

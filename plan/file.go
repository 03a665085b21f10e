package plan

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
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
	data, err := Encode(p)
	if err != nil {
		return err
	}

	return atomicfile.Write(path, data, 0o600)
}

// Encode is a plan file's bytes: the plan in a checksummed envelope.
func Encode(p *Plan) ([]byte, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}

	sum := sha256.Sum256(body)

	data, err := json.MarshalIndent(envelope{Format: fileFormat, Checksum: "sha256:" + hex.EncodeToString(sum[:]), Plan: body}, "", "  ")
	if err != nil {
		return nil, err
	}

	return append(data, '\n'), nil
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

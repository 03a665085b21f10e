package plan

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ghcrsync/ghcrsync/internal/atomicfile"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// fileFormat names the saved-plan envelope.
const fileFormat = "ghcrsync-plan"

// ErrCorrupt is returned for a plan file that does not verify.
var ErrCorrupt = errors.New("the plan file is corrupt or was edited")

// FormatError is a plan file of a format this ghcrsync does not read.
type FormatError struct{ Path, Version string }

func (e *FormatError) Error() string {
	return fmt.Sprintf("plan file %s has format_version %s; this ghcrsync reads 1.x: run plan again with this version", e.Path, e.Version)
}

// IsRefused reports whether err refuses a plan file itself: damaged, edited or of another format.
func IsRefused(err error) bool {
	var fe *FormatError

	return errors.Is(err, ErrCorrupt) || errors.As(err, &fe)
}

// envelope is a plan file: the plan, its checksum (anyone can recompute it: it only tells a
// damaged file), and its authentication code, "SCHEME:HEX", an HMAC-SHA256 under a key derived
// from the decrypted credential's secret: only someone who can decrypt the credential can make
// a plan apply accepts.
type envelope struct {
	Format   string          `json:"format"`
	Checksum string          `json:"checksum"`
	MAC      string          `json:"mac"`
	Plan     json.RawMessage `json:"plan"`
}

// seal is what Decode read: the body the MAC covers.
type seal struct {
	mac  string
	body []byte
}

// Save writes the plan, sealed with key, 0600, atomically (temp file, fsync, rename).
func Save(path string, p *Plan, key []byte) error {
	data, err := Encode(p, key)
	if err != nil {
		return err
	}

	return atomicfile.Write(path, data, 0o600)
}

// Encode is a plan file's bytes: the plan in an envelope with its checksum and its MAC.
func Encode(p *Plan, key []byte) ([]byte, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}

	sum := sha256.Sum256(body)

	data, err := json.MarshalIndent(envelope{Format: fileFormat, Checksum: "sha256:" + hex.EncodeToString(sum[:]), MAC: mac(key, body), Plan: body}, "", "  ")
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
		return nil, &FormatError{Path: path, Version: p.FormatVersion}
	}

	p.seal = &seal{mac: env.MAC, body: compact.Bytes()}

	return &p, nil
}

// sealScheme names how a plan's MAC was made: HMAC-SHA256 of the body under the credential's
// plan key (credential.PlanKey, HKDF of the deploy side's age identity, the SOPS data key and the
// credential's secret). retiredSchemes are the ones older versions wrote: v1's key could be
// computed from public digests, v2's by whoever knows the token alone, v3's by whoever also
// chose the SOPS data key (the token's minter encrypts the file), so their plans are refused.
const sealScheme = "hmac-sha256+hkdf-v4"

var retiredSchemes = []string{"hmac-sha256", "hmac-sha256+hkdf-v2", "hmac-sha256+hkdf-v3"}

func mac(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)

	return sealScheme + ":" + hex.EncodeToString(m.Sum(nil))
}

// Authentic reports whether a plan read from a file was sealed with key (a plan made in this
// process, never written, is). The comparison takes constant time.
func (p *Plan) Authentic(key []byte) bool {
	if p.seal == nil {
		return true
	}

	return hmac.Equal([]byte(p.seal.mac), []byte(mac(key, p.seal.body)))
}

// RetiredSeal reports whether a plan read from a file was sealed by an older ghcrsync, with a
// scheme no longer accepted (its authentication code proves nothing).
func (p *Plan) RetiredSeal() bool {
	if p.seal == nil {
		return false
	}

	scheme, _, _ := strings.Cut(p.seal.mac, ":")

	return slices.Contains(retiredSchemes, scheme)
}

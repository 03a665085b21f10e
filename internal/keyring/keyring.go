// Package keyring is the kubelet's node keyring on a node's disk, with no client: ROOT/config.json
// (ROOT the kubelet's --root-dir, /var/lib/kubelet on Talos), a docker config the kubelet reads
// — cached five minutes, an absent file included — and whose credential for an image's registry
// it sends with every CRI PullImage of a pod that has no pull secret for it. containerd uses a
// credential that comes with the request before its own configured one, so a node whose Talos
// cannot reload registry auth live (Talos ≤ 1.13) pulls with the keyring's credential from the
// moment its kubelet reads the file: no reboot, no restart.
//
// This package holds the rules: how an entry is merged into a config.json someone else may also
// write (every other registry's entry kept byte for byte), how the kubelet matches an entry to a
// registry, what a writer reports (digests, never the credential), and the writer pod's shape.
// internal/cluster runs the pod; `ghcrsync node-keyring` is the command inside it.
package keyring

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/credential"
)

// File is the keyring's name in the kubelet's root directory.
const File = "config.json"

// CacheLifetime is how long the kubelet keeps what it read of the keyring (an empty read too)
// before it reads the file again, at the next pull after that: kubelet 1.35's
// credentialprovider.NewDefaultDockerKeyring. A keyring written now is used at the latest this
// long after the write, from the first pull after that.
const CacheLifetime = 5 * time.Minute

// Report is what a writer found and did, told without the credential: auth digests only.
type Report struct {
	// Path is the file, as the node sees it.
	Path string `json:"path"`
	// Before are the digests of the registry's entries the file held (in the kubelet's order of
	// keys), "" for an entry whose credential cannot be read; none when it held none.
	Before []string `json:"before,omitempty"`
	// After is the digest of the registry's entry the file holds now ("" when removed).
	After string `json:"after,omitempty"`
	// Kept counts the other registries' entries, left as they were.
	Kept int `json:"kept"`
	// Created: there was no file.
	Created bool `json:"created,omitempty"`
	// Changed: the file was rewritten (false: it already held exactly this).
	Changed bool `json:"changed,omitempty"`
	// Written is the file's last change (its mtime, by the node's clock); ReadAt when it was
	// first read after that (its atime, when later: ModeAwait), zero while unread.
	Written time.Time `json:"written,omitzero"`
	ReadAt  time.Time `json:"read_at,omitzero"`
}

// String is the report as the writer's termination message.
func (r Report) String() string {
	b, _ := json.Marshal(r)

	return string(b)
}

// ParseReport reads a writer's termination message.
func ParseReport(msg string) (Report, error) {
	var r Report

	dec := json.NewDecoder(strings.NewReader(strings.TrimSpace(msg)))
	dec.DisallowUnknownFields()

	if err := dec.Decode(&r); err != nil {
		return Report{}, fmt.Errorf("the keyring writer's report is not one: %w", err)
	}

	return r, nil
}

// Entry is one credential as the keyring holds it: {"auth": base64(username:password)}.
func Entry(username, password string) []byte {
	b, _ := json.Marshal(map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(username + ":" + password))})

	return b
}

// ErrUnreadable is a config.json the kubelet cannot read as it stands: it would ignore the whole
// file (and every credential in it), so ghcrsync does not write into it.
var ErrUnreadable = errors.New("the kubelet cannot read it")

// Merge is current (a config.json, nil when there is none) with entry as the only credential for
// registry: every entry the kubelet would match to that registry's host (the bare host, a scheme,
// a /v1/ or /v2/ suffix, a path under it) is replaced by one entry keyed by the host; every other
// entry, and every other top-level field, is kept byte for byte. It reports what it found.
func Merge(current []byte, registry string, entry []byte) ([]byte, Report, error) {
	return rewrite(current, registry, entry)
}

// Remove is current with no entry for registry.
func Remove(current []byte, registry string) ([]byte, Report, error) {
	return rewrite(current, registry, nil)
}

// Read reports what current holds for registry, changing nothing.
func Read(current []byte, registry string) (Report, error) {
	if current == nil {
		return Report{}, nil
	}

	doc, err := parse(current)
	if err != nil {
		return Report{}, err
	}

	auths, err := doc.auths()
	if err != nil {
		return Report{}, err
	}

	var r Report

	for _, m := range auths {
		if hostOf(m.key) == registry {
			r.Before = append(r.Before, digest(m.raw))
		} else {
			r.Kept++
		}
	}

	return r, nil
}

func rewrite(current []byte, registry string, entry []byte) ([]byte, Report, error) {
	r := Report{Created: current == nil}

	if current == nil {
		current = []byte("{}")
	}

	doc, err := parse(current)
	if err != nil {
		return nil, Report{}, err
	}

	auths, err := doc.auths()
	if err != nil {
		return nil, Report{}, err
	}

	var next []member

	for _, m := range auths {
		if hostOf(m.key) == registry {
			r.Before = append(r.Before, digest(m.raw))

			continue
		}

		r.Kept++
		next = append(next, m)
	}

	if entry != nil {
		if _, _, err := decodeEntry(entry); err != nil {
			return nil, Report{}, fmt.Errorf("the entry to write: %w", err)
		}

		next = append([]member{{key: registry, raw: entry}}, next...)
		r.After = digest(entry)
	}

	doc.setAuths(next)
	out := doc.encode()

	if err := Readable(out); err != nil { // what the kubelet will make of it
		return nil, Report{}, err
	}

	r.Changed = !bytes.Equal(out, current) || r.Created

	return out, r, nil
}

// Readable checks a config.json as the kubelet reads it (kubelet 1.35's
// credentialprovider.readDockerConfigJSONFileFromBytes): JSON, its auths a map of entries each
// with an auth field, if any, of base64 (padded or not) "username:password". One bad entry makes
// the kubelet ignore the whole file.
func Readable(data []byte) error {
	var doc struct {
		Auths map[string]json.RawMessage `json:"auths"`
	}

	if err := json.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config.json: %w: it is not a docker config (%s)", ErrUnreadable, credential.JSONProblem(err))
	}

	for key, raw := range doc.Auths {
		if _, _, err := decodeEntry(raw); err != nil {
			return fmt.Errorf("config.json: %w: its entry %q: %v", ErrUnreadable, key, err)
		}
	}

	return nil
}

// decodeEntry reads one entry as the kubelet does: username and password, which auth, when set,
// replaces.
func decodeEntry(raw []byte) (username, password string, err error) {
	var e struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Auth     string `json:"auth"`
	}

	if err := json.Unmarshal(raw, &e); err != nil {
		return "", "", errors.New("not an object of username, password and auth strings")
	}

	if e.Auth == "" {
		return e.Username, e.Password, nil
	}

	enc := base64.RawStdEncoding
	if strings.HasSuffix(strings.TrimSpace(e.Auth), "=") {
		enc = base64.StdEncoding
	}

	decoded, err := enc.DecodeString(e.Auth)
	if err != nil {
		return "", "", errors.New("its auth is not base64")
	}

	username, password, ok := strings.Cut(string(decoded), ":")
	if !ok {
		return "", "", errors.New("its auth is not base64 of username:password")
	}

	return username, password, nil
}

// digest identifies an entry's credential (authdigest.Of), "" when it cannot be read.
func digest(raw []byte) string {
	u, p, err := decodeEntry(raw)
	if err != nil {
		return ""
	}

	return authdigest.Of(u, p)
}

// hostOf is the registry host the kubelet files a config.json key under: the key with a scheme
// added when it has none, parsed as a URL (kubelet 1.35's BasicDockerKeyring.Add). An entry
// keyed by a path under a host (ghcr.io/org) is matched before the bare host for images under
// it, so it is the host's as much as the bare key.
func hostOf(key string) string {
	value := key
	if !strings.HasPrefix(value, "https://") && !strings.HasPrefix(value, "http://") {
		value = "https://" + value
	}

	u, err := url.Parse(value)
	if err != nil {
		return ""
	}

	return u.Host
}

// member is one field of a JSON object: its key, and its value as it was written.
type member struct {
	key string
	raw json.RawMessage
}

// document is a config.json's top level, in its order.
type document struct{ members []member }

func parse(data []byte) (*document, error) {
	members, err := object(data)
	if err != nil {
		return nil, fmt.Errorf("config.json: %w: it is not a docker config (%v)", ErrUnreadable, err)
	}

	return &document{members: members}, nil
}

// object splits a JSON object into its members, each value's bytes as written.
func object(data []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(data))

	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("not a JSON object")
	}

	var out []member

	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, errors.New("invalid JSON")
		}

		key, _ := t.(string)

		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, errors.New("invalid JSON")
		}

		out = append(out, member{key: key, raw: bytes.TrimSpace(raw)})
	}

	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, errors.New("invalid JSON")
	}

	if _, err := dec.Token(); err == nil {
		return nil, errors.New("more than one JSON value")
	}

	return out, nil
}

func (d *document) auths() ([]member, error) {
	for _, m := range d.members {
		if m.key == "auths" {
			if string(m.raw) == "null" {
				return nil, nil
			}

			auths, err := object(m.raw)
			if err != nil {
				return nil, fmt.Errorf("config.json: %w: its auths is not an object", ErrUnreadable)
			}

			return auths, nil
		}
	}

	return nil, nil
}

// setAuths puts auths in place of the document's, first when it had none.
func (d *document) setAuths(auths []member) {
	raw := encodeObject(auths)

	for i, m := range d.members {
		if m.key == "auths" {
			d.members[i].raw = raw

			return
		}
	}

	d.members = append([]member{{key: "auths", raw: raw}}, d.members...)
}

func (d *document) encode() []byte { return append(encodeObject(d.members), '\n') }

func encodeObject(members []member) []byte {
	var b bytes.Buffer

	b.WriteByte('{')

	for i, m := range members {
		if i > 0 {
			b.WriteByte(',')
		}

		k, _ := json.Marshal(m.key)
		b.Write(k)
		b.WriteByte(':')
		b.Write(m.raw)
	}

	b.WriteByte('}')

	return b.Bytes()
}

// Auth is one credential the keyring gives a registry.
type Auth struct{ Username, Password string }

// Lookup is what a readable config.json gives registry, in the order the kubelet tries them: the
// entries matching the registry's host, the longer (more specific) keys first.
func Lookup(data []byte, registry string) []Auth {
	doc, err := parse(data)
	if err != nil {
		return nil
	}

	auths, err := doc.auths()
	if err != nil {
		return nil
	}

	slices.SortStableFunc(auths, func(a, b member) int { return strings.Compare(b.key, a.key) })

	var out []Auth

	for _, m := range auths {
		if hostOf(m.key) != registry {
			continue
		}

		if u, p, err := decodeEntry(m.raw); err == nil {
			out = append(out, Auth{Username: u, Password: p})
		}
	}

	return out
}

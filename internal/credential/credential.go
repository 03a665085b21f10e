// Package credential loads the pull credential from its SOPS file, checks it, digests it, and
// proves it against the registry. The plaintext exists only in memory: it is never logged,
// printed or written (Credential's String and GoString redact it).
package credential

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/getsops/sops/v3/aes"
	"github.com/getsops/sops/v3/cmd/sops/common"
	"github.com/getsops/sops/v3/cmd/sops/formats"
	sopsconfig "github.com/getsops/sops/v3/config"
	"sigs.k8s.io/yaml"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/human"
	"github.com/ghcrsync/ghcrsync/internal/readlimit"
)

// Credential is a registry credential decoded from a dockerconfigjson.
type Credential struct {
	Registry string
	Username string
	password string
	raw      []byte // the dockerconfigjson as stored
	// dataKey is the SOPS file's data key, the key its values are encrypted with: only a holder
	// of one of the file's recipient keys (the age key) can decrypt it — but whoever encrypted the
	// file chose it. deployKey is the age identity that decrypted it (the deploy side's secret,
	// nil when none ghcrsync can read; deployErr says why). Both are PlanKey's input.
	dataKey   []byte
	deployKey []byte
	deployErr error
}

// Password returns the secret. Call it only to hand the secret to the registry, Talos or a
// Kubernetes Secret.
func (c *Credential) Password() string { return c.password }

// DockerConfigJSON returns the dockerconfigjson bytes exactly as stored in the file.
func (c *Credential) DockerConfigJSON() []byte { return c.raw }

// Revision identifies the credential: the hex SHA-256 of the decrypted dockerconfigjson.
func (c *Credential) Revision() string { return authdigest.DockerConfig(c.raw) }

// AuthDigest identifies the registry's username/password pair (authdigest.Of).
func (c *Credential) AuthDigest() string { return authdigest.Of(c.Username, c.password) }

// PullSecretJSON is what the pull secrets receive: a dockerconfigjson holding only the
// configured registry's entry, never the other registries' entries the SOPS file may hold.
func (c *Credential) PullSecretJSON() []byte {
	type entry struct {
		Username string `json:"username"`
		Password string `json:"password"`
		Auth     string `json:"auth"`
	}

	b, _ := json.Marshal(map[string]map[string]entry{"auths": {c.Registry: {
		Username: c.Username, Password: c.password, Auth: base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.password)),
	}}})

	return b
}

// PullSecretJSONs is each named credential's PullSecretJSON: what the pull secrets of each
// tenant credential receive.
func PullSecretJSONs(byName map[string]*Credential) map[string][]byte {
	out := make(map[string][]byte, len(byName))
	for name, c := range byName {
		out[name] = c.PullSecretJSON()
	}

	return out
}

// PullSecretRevision is the digest pull secrets are compared by: of PullSecretJSON.
func (c *Credential) PullSecretRevision() string { return authdigest.DockerConfig(c.PullSecretJSON()) }

// planKeySalt and planKeyInfo are PlanKey's HKDF salt and context. A change of either retires
// every plan sealed before it (plan.sealScheme names the scheme in the file).
const (
	planKeySalt = "ghcrsync.dev plan-key salt 2026-12"
	planKeyInfo = "ghcrsync plan authentication v4"
)

// ErrNoPlanKey is a credential not read from a SOPS file: it has no data key to seal plans with.
var ErrNoPlanKey = errors.New("the credential was not decrypted from its SOPS file: no plan key")

// PlanKey is the key that authenticates saved plans: HKDF-SHA256 of the deploy side's age
// identity (the one that decrypted the SOPS file), the file's data key and the credential's
// secret, salted, bound to the registry and the username. The identity is what only the deploy
// side holds: the person who encrypts a new token knows the token and chooses the data key, and
// still cannot seal a plan apply accepts. Every digest ghcrsync writes (the revision, the auth
// digest, the pull-secret revision) is a plain hash of other input and none is HKDF's input.
func (c *Credential) PlanKey() ([]byte, error) {
	if len(c.dataKey) == 0 {
		return nil, ErrNoPlanKey
	}

	if len(c.deployKey) == 0 {
		return nil, fmt.Errorf("credential: %w", c.deployErr)
	}

	ikm := make([]byte, 0, len(c.deployKey)+len(c.dataKey)+len(c.password)+2)
	ikm = append(append(append(append(append(ikm, c.deployKey...), 0), c.dataKey...), 0), c.password...)

	key, err := hkdf.Key(sha256.New, ikm, []byte(planKeySalt), planKeyInfo+"\x00"+c.Registry+"\x00"+c.Username, sha256.Size)
	if err != nil { // only for a key length HKDF cannot give: a programming error
		panic(err)
	}

	return key, nil
}

// String never includes the secret.
func (c *Credential) String() string {
	return fmt.Sprintf("credential(registry=%s user=%s revision=%s)", c.Registry, c.Username, human.Short(c.Revision()))
}

// GoString never includes the secret.
func (c *Credential) GoString() string { return c.String() }

// Load decrypts the SOPS file in-process (age keys from SOPS_AGE_KEY_FILE or SOPS_AGE_KEY),
// extracts the dockerconfigjson at keyPath and validates it for registry.
func Load(path string, keyPath []string, registry string) (*Credential, error) {
	data, err := readlimit.File(path, readlimit.SOPSFile)
	if err != nil {
		return nil, fmt.Errorf("credential: read SOPS file %s: %w", path, err)
	}

	doc, err := decryptDocument(data, path)
	if err != nil {
		return nil, err
	}

	c, err := FromDocument(doc.plain, keyPath, registry)
	if err != nil {
		return nil, fmt.Errorf("credential: %s%w", path, err)
	}

	c.dataKey, c.deployKey, c.deployErr = doc.dataKey, doc.deployKey, doc.deployErr

	return c, nil
}

// FromDocument extracts the dockerconfigjson at keyPath from a decrypted YAML/JSON document
// and validates it for registry. Its errors read after the document's name.
func FromDocument(plain []byte, keyPath []string, registry string) (*Credential, error) {
	value, err := lookup(plain, keyPath)
	if err != nil {
		return nil, fmt.Errorf(": %w", err)
	}

	c, err := Parse(value, registry)
	if err != nil {
		return nil, fmt.Errorf(" at %s: %w", strings.Join(keyPath, "."), err)
	}

	return c, nil
}

// decrypted is a SOPS file decrypted: its plaintext, its data key, and the age identity that
// decrypted it (nil when ghcrsync cannot read one; deployErr says why).
type decrypted struct {
	plain, dataKey, deployKey []byte
	deployErr                 error
}

// decryptDocument decrypts a SOPS file's bytes in-process (its format from path's extension), as
// sops' decrypt package does — load the tree, decrypt its data key with the available keys,
// decrypt the values, check the file's MAC — and returns the plaintext, the data key and the age
// identity that decrypts it (deployIdentity).
func decryptDocument(data []byte, path string) (*decrypted, error) {
	store := common.StoreForFormat(formats.FormatForPath(path), sopsconfig.NewStoresConfig())

	tree, err := store.LoadEncryptedFile(data)
	if err != nil {
		return nil, decryptError(path, err)
	}

	key, err := tree.Metadata.GetDataKey()
	if err != nil {
		return nil, decryptError(path, err)
	}

	cipher := aes.NewCipher()

	mac, err := tree.Decrypt(key, cipher)
	if err != nil {
		return nil, decryptError(path, err)
	}

	stored, err := cipher.Decrypt(tree.Metadata.MessageAuthenticationCode, key, tree.Metadata.LastModified.Format(time.RFC3339))
	if err != nil {
		return nil, decryptError(path, fmt.Errorf("Failed to decrypt original mac: %w", err))
	}

	if stored != mac {
		return nil, decryptError(path, errors.New("MAC mismatch: the file's values do not match its MAC"))
	}

	plain, err := store.EmitPlainFile(tree.Branches)
	if err != nil {
		return nil, decryptError(path, err)
	}

	deployKey, deployErr := deployIdentity(tree.Metadata)

	return &decrypted{plain: plain, dataKey: key, deployKey: deployKey, deployErr: deployErr}, nil
}

func decryptError(path string, err error) error {
	msg := err.Error()

	switch {
	case strings.Contains(msg, "sops metadata not found"):
		return fmt.Errorf("credential: %s is not SOPS-encrypted (no sops metadata): encrypt it with sops, or point sops_file at the encrypted file", path)
	case strings.Contains(msg, "get data key") || strings.Contains(msg, "Error getting data key") || strings.Contains(msg, "failed to decrypt"):
		keyFile, keySet := os.Getenv("SOPS_AGE_KEY_FILE"), os.Getenv("SOPS_AGE_KEY") != ""

		return fmt.Errorf("credential: cannot decrypt %s with the available age keys (SOPS_AGE_KEY_FILE=%q, SOPS_AGE_KEY set: %t): "+
			"use the age key whose recipient the file is encrypted for", path, keyFile, keySet)
	case strings.Contains(msg, "MAC mismatch"), strings.Contains(msg, "message authentication failed"),
		strings.Contains(msg, "Could not decrypt value"), strings.Contains(msg, "base64"):
		return fmt.Errorf("credential: %s was damaged or edited after encryption (%s): restore it from Git, or re-encrypt it with sops", path, firstLine(msg))
	}

	return fmt.Errorf("credential: decrypt %s: %w", path, err)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")

	return line
}

// lookup walks keyPath through the decrypted YAML/JSON document. Values under a Secret's
// "data" are base64 and are decoded.
func lookup(doc []byte, keyPath []string) ([]byte, error) {
	var root any
	if err := yaml.Unmarshal(doc, &root); err != nil {
		return nil, fmt.Errorf("decrypted document is not YAML: %w", err)
	}

	cur := root

	for i, k := range keyPath {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("key path %s: %s is not a map", strings.Join(keyPath, "."), strings.Join(keyPath[:i], "."))
		}

		next, ok := m[k]
		if !ok {
			keys := make([]string, 0, len(m))
			for kk := range m {
				keys = append(keys, kk)
			}

			return nil, fmt.Errorf("key path %s not found: no %q under %q (keys there: %s); set credential.key in the configuration",
				strings.Join(keyPath, "."), k, strings.Join(keyPath[:i], "."), strings.Join(keys, ", "))
		}

		cur = next
	}

	s, ok := cur.(string)
	if !ok {
		return nil, fmt.Errorf("key path %s does not hold a string", strings.Join(keyPath, "."))
	}

	if len(keyPath) > 0 && keyPath[0] == "data" {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("key path %s: data values are base64, and this one is not", strings.Join(keyPath, "."))
		}

		return b, nil
	}

	return []byte(s), nil
}

// ErrInvalid marks a dockerconfigjson that breaks a rule.
var ErrInvalid = errors.New("invalid dockerconfigjson")

// Parse validates a dockerconfigjson for registry: an "auths" entry for it with a non-empty
// username and password, or an "auth" that is base64 of "user:pass"; when both forms are
// present they must agree.
func Parse(dockerconfigjson []byte, registry string) (*Credential, error) {
	var doc struct {
		Auths map[string]struct {
			Username string `json:"username"`
			Password string `json:"password"`
			Auth     string `json:"auth"`
		} `json:"auths"`
	}

	if err := json.Unmarshal(dockerconfigjson, &doc); err != nil {
		return nil, fmt.Errorf("%w: not JSON (%s)", ErrInvalid, JSONProblem(err))
	}

	key, err := authsKey(slices.Collect(maps.Keys(doc.Auths)), registry)
	if err != nil {
		return nil, err
	}

	e := doc.Auths[key]

	user, pass := e.Username, e.Password

	if e.Auth != "" {
		raw, err := base64.StdEncoding.DecodeString(e.Auth)
		if err != nil {
			return nil, fmt.Errorf("%w: auths[%q].auth is not base64", ErrInvalid, registry)
		}

		au, ap, ok := strings.Cut(string(raw), ":")
		if !ok || au == "" || ap == "" {
			return nil, fmt.Errorf("%w: auths[%q].auth is not base64 of \"user:password\"", ErrInvalid, registry)
		}

		if (user != "" || pass != "") && (au != user || ap != pass) {
			return nil, fmt.Errorf("%w: auths[%q]: username/password and auth disagree", ErrInvalid, registry)
		}

		user, pass = au, ap
	}

	if user == "" || pass == "" {
		return nil, fmt.Errorf("%w: auths[%q] needs a non-empty username and password (or auth)", ErrInvalid, registry)
	}

	raw := append([]byte(nil), dockerconfigjson...)
	if key != registry {
		if raw, err = renameAuths(dockerconfigjson, key, registry); err != nil {
			return nil, err
		}
	}

	return &Credential{Registry: registry, Username: user, password: pass, raw: raw}, nil
}

// authsHost is the registry host an auths key names, as the kubelet and Docker read it: the
// key may carry a scheme and a path ("https://ghcr.io", "https://ghcr.io/v2/").
func authsHost(key string) string {
	h := key
	if _, rest, ok := strings.Cut(h, "://"); ok {
		h = rest
	}

	h, _, _ = strings.Cut(h, "/")

	return strings.ToLower(h)
}

// authsKey is the one auths key for registry: the key itself, or a key that names the same
// host with a scheme or a path. None is an error that lists the keys; so are two (the kubelet
// would try both, and a second credential for the registry would outlive the rotation).
func authsKey(keys []string, registry string) (string, error) {
	slices.Sort(keys)

	var match []string

	for _, k := range keys {
		if authsHost(k) == strings.ToLower(registry) {
			match = append(match, k)
		}
	}

	switch len(match) {
	case 1:
		return match[0], nil
	case 0:
		return "", fmt.Errorf("%w: no auths entry for %q (entries: %s)", ErrInvalid, registry, strings.Join(keys, ", "))
	}

	return "", fmt.Errorf("%w: auths entries %s all name %q: keep one (\"%s\")", ErrInvalid, strings.Join(match, ", "), registry, registry)
}

// renameAuths is the document with its auths key from renamed to to, everything else kept: the
// credential is written out under the registry's name, which every consumer reads.
func renameAuths(dockerconfigjson []byte, from, to string) ([]byte, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(dockerconfigjson, &doc); err != nil {
		return nil, fmt.Errorf("%w: not JSON (%s)", ErrInvalid, JSONProblem(err))
	}

	var auths map[string]json.RawMessage
	if err := json.Unmarshal(doc["auths"], &auths); err != nil {
		return nil, fmt.Errorf("%w: auths (%s)", ErrInvalid, JSONProblem(err))
	}

	auths[to] = auths[from]
	delete(auths, from)

	b, err := json.Marshal(auths)
	if err != nil {
		return nil, err
	}

	doc["auths"] = b

	return json.Marshal(doc)
}

// JSONProblem describes a JSON error without quoting the input (which may hold the secret).
func JSONProblem(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	}

	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("%s has the wrong type", te.Field)
	}

	return "malformed"
}

// FromFields is the credential of a registry auth entry found elsewhere — a node's machine
// config, a pull secret — given as username and password, or as auth (base64 of
// "user:password"): what `plan` asks the registry about, to know whether a credential in use
// still pulls.
func FromFields(registry, username, password, auth string) (*Credential, error) {
	entry := map[string]string{"username": username, "password": password}
	if username == "" && password == "" {
		entry = map[string]string{"auth": auth}
	}

	raw, err := json.Marshal(map[string]any{"auths": map[string]any{registry: entry}})
	if err != nil {
		return nil, err
	}

	return Parse(raw, registry)
}

// Package nodetemplate reads and rewrites the machine template a cluster autoscaler boots new
// nodes from: a Talos machine config kept in a Secret's key, as it is ("talos"), base64-encoded
// ("talos-base64", the hcloud autoscaler's HCLOUD_CLOUD_INIT), or inside the hcloud autoscaler's
// cluster config ("hcloud-cluster-config", HCLOUD_CLUSTER_CONFIG: base64 of JSON whose
// nodeConfigs.<pool>.cloudInit is each pool's config).
//
// A rewrite changes only the registry's credential and keeps everything else byte for byte where
// the format allows: the other YAML documents, the other JSON fields, the base64 line layout.
// Pure functions: no client in sight.
package nodetemplate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/config"
	configconfig "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/types/cri"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	yaml "go.yaml.in/yaml/v3"

	"github.com/ghcrsync/ghcrsync/internal/authdigest"
	"github.com/ghcrsync/ghcrsync/internal/registryauth"
)

// Formats of a template's Secret value.
const (
	FormatTalos       = "talos"
	FormatTalosBase64 = "talos-base64"
	FormatHcloud      = "hcloud-cluster-config"
)

// Formats lists the formats, for messages and the configuration's validation.
var Formats = []string{FormatTalos, FormatTalosBase64, FormatHcloud}

// Pool is one machine config of a template: the hcloud node pool's, or the only one ("").
type Pool struct {
	Name string
	// Digest is the registry credential's digest in the config (authdigest; "" when none).
	Digest string
	// Form is how the config carries the credential: "document" (a RegistryAuthConfig), "legacy"
	// (machine.registries.config) or "none" (a rewrite adds a RegistryAuthConfig document).
	Form string
}

// Forms of the credential in a config.
const (
	FormDocument = "document"
	FormLegacy   = "legacy"
	FormNone     = "none"
)

// Read decodes a template value and reports each selected pool's credential digest for registry.
// pools selects hcloud node pools (empty: every pool that has a cloudInit); it must be empty for
// the other formats.
func Read(format string, value []byte, pools []string, registry string) ([]Pool, error) {
	var out []Pool

	err := walk(format, value, pools, func(pool string, cfg []byte) ([]byte, error) {
		p, err := inspect(cfg, registry)
		if err != nil {
			return nil, inPool(pool, err)
		}

		p.Name = pool
		out = append(out, p)

		return nil, nil
	})

	return out, err
}

// Rewrite returns the template value with the registry's credential replaced in every selected
// pool's config, in the form each config already uses, everything else kept. The result is
// checked: it decodes, carries the new credential, and differs from value in nothing else.
func Rewrite(format string, value []byte, pools []string, registry, username, password string) ([]byte, error) {
	want := authdigest.Of(username, password)

	return walkRewrite(format, value, pools, func(pool string, cfg []byte) ([]byte, error) {
		next, err := rewriteConfig(cfg, registry, username, password)
		if err != nil {
			return nil, inPool(pool, err)
		}

		if err := sameButCredential(cfg, next, registry, want); err != nil {
			return nil, inPool(pool, fmt.Errorf("the rewritten config is wrong (a ghcrsync bug; nothing was written): %w", err))
		}

		return next, nil
	})
}

// CredentialOnly reports whether next differs from prev in nothing but the registry's
// credential in the selected pools' configs — what a rotation writes (nil), or what else it
// changes. Both are rewritten with one neutral credential, in the form each already uses: equal
// results differ in the credential alone. A value that does not decode is refused.
func CredentialOnly(format string, prev, next []byte, pools []string, registry string) error {
	if bytes.Equal(prev, next) {
		return nil
	}

	a, err := Rewrite(format, prev, pools, registry, neutralUser, neutralPassword)
	if err != nil {
		return fmt.Errorf("the current value: %w", err)
	}

	b, err := Rewrite(format, next, pools, registry, neutralUser, neutralPassword)
	if err != nil {
		return fmt.Errorf("the new value: %w", err)
	}

	if !bytes.Equal(a, b) {
		return fmt.Errorf("it changes more than the credential for %s: another part of a machine config, another pool, or the value's layout", registry)
	}

	return nil
}

// The neutral credential CredentialOnly compares with (never written anywhere).
const (
	neutralUser     = "ghcrsync-compare"
	neutralPassword = "ghcrsync-compare"
)

func inPool(pool string, err error) error {
	if pool == "" {
		return err
	}

	return fmt.Errorf("pool %q: %w", pool, err)
}

// walk visits each selected config of a template.
func walk(format string, value []byte, pools []string, visit func(pool string, cfg []byte) ([]byte, error)) error {
	_, err := walkRewrite(format, value, pools, visit)

	return err
}

// walkRewrite visits each selected config; a non-nil return replaces it, and the value is
// re-encoded around the replacements.
func walkRewrite(format string, value []byte, pools []string, visit func(pool string, cfg []byte) ([]byte, error)) ([]byte, error) {
	if format != FormatHcloud && len(pools) > 0 {
		return nil, fmt.Errorf("pools apply to format %q only, not %q", FormatHcloud, format)
	}

	switch format {
	case FormatTalos:
		next, err := visit("", value)
		if next == nil || err != nil {
			return value, err
		}

		return next, nil
	case FormatTalosBase64:
		cfg, err := unbase64(value)
		if err != nil {
			return nil, err
		}

		next, err := visit("", cfg)
		if next == nil || err != nil {
			return value, err
		}

		return rebase64(value, next), nil
	case FormatHcloud:
		js, err := unbase64(value)
		if err != nil {
			return nil, err
		}

		next, changed, err := rewriteHcloud(js, pools, visit)
		if err != nil || !changed {
			return value, err
		}

		return rebase64(value, next), nil
	}

	return nil, fmt.Errorf("unknown format %q (one of %s)", format, strings.Join(Formats, ", "))
}

// unbase64 decodes standard base64, wrapped over lines or not.
func unbase64(value []byte) ([]byte, error) {
	out, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(value)), ""))
	if err != nil {
		return nil, fmt.Errorf("the value is not base64: %w", err)
	}

	return out, nil
}

// rebase64 encodes data laid out as orig was: wrapped at the same width, and with the same
// trailing newline.
func rebase64(orig, data []byte) []byte {
	enc := base64.StdEncoding.EncodeToString(data)
	trimmed := bytes.TrimRight(orig, "\r\n")
	width := bytes.IndexByte(trimmed, '\n')

	var b strings.Builder

	for width > 0 && len(enc) > width {
		b.WriteString(enc[:width])
		b.WriteByte('\n')
		enc = enc[width:]
	}

	b.WriteString(enc)
	b.Write(orig[len(trimmed):])

	return []byte(b.String())
}

// rewriteHcloud visits the selected pools' cloudInit strings and splices the replacements into
// the JSON, leaving every other byte as it was.
func rewriteHcloud(js []byte, pools []string, visit func(pool string, cfg []byte) ([]byte, error)) ([]byte, bool, error) {
	spans, err := cloudInits(js)
	if err != nil {
		return nil, false, err
	}

	selected, err := selectPools(spans, pools)
	if err != nil {
		return nil, false, err
	}

	type edit struct {
		span [2]int
		text []byte
	}

	var edits []edit

	for _, p := range selected {
		span := spans[p]

		var cfg string
		if err := json.Unmarshal(js[span[0]:span[1]], &cfg); err != nil {
			return nil, false, inPool(p, fmt.Errorf("cloudInit: %w", err))
		}

		next, err := visit(p, []byte(cfg))
		if err != nil {
			return nil, false, err
		}

		if next != nil {
			edits = append(edits, edit{span, quote(string(next))})
		}
	}

	if len(edits) == 0 {
		return js, false, nil
	}

	slices.SortFunc(edits, func(a, b edit) int { return b.span[0] - a.span[0] })

	out := slices.Clone(js)
	for _, e := range edits {
		out = slices.Concat(out[:e.span[0]], e.text, out[e.span[1]:])
	}

	return out, true, nil
}

// selectPools is pools (every one of them with a cloudInit), or when none is named every pool
// with a cloudInit, sorted.
func selectPools(spans map[string][2]int, pools []string) ([]string, error) {
	known := slices.Sorted(maps.Keys(spans))

	if len(pools) == 0 {
		if len(known) == 0 {
			return nil, errors.New("the cluster config has no nodeConfigs.<pool>.cloudInit: no machine config to manage")
		}

		return known, nil
	}

	for _, p := range pools {
		if _, ok := spans[p]; !ok {
			return nil, fmt.Errorf("no pool %q with a cloudInit in nodeConfigs (pools with one: %s)", p, strings.Join(known, ", "))
		}
	}

	return pools, nil
}

// quote encodes s as a JSON string without escaping <, > and &.
func quote(s string) []byte {
	var b bytes.Buffer

	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)

	return bytes.TrimRight(b.Bytes(), "\n")
}

// cloudInits finds, in the hcloud cluster config, the byte span of each nodeConfigs.<pool>.cloudInit
// string.
func cloudInits(js []byte) (map[string][2]int, error) {
	var shape struct {
		NodeConfigs map[string]json.RawMessage `json:"nodeConfigs"`
	}

	if err := json.Unmarshal(js, &shape); err != nil {
		return nil, fmt.Errorf("the decoded value is not the hcloud cluster config's JSON: %w", err)
	}

	var path jsonPath

	spans := map[string][2]int{}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()

	for {
		before := dec.InputOffset()

		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}

		if err != nil {
			return nil, fmt.Errorf("the decoded value is not JSON: %w", err)
		}

		if path.step(tok) {
			continue
		}

		if s, ok := tok.(string); ok && path.at("nodeConfigs", "", "cloudInit") && s != "" {
			start := before + int64(bytes.IndexByte(js[before:], '"'))
			spans[path.stack[1].key] = [2]int{int(start), int(dec.InputOffset())}
		}

		path.consumed()
	}

	return spans, nil
}

// jsonPath follows where a JSON token stream is: the open objects and arrays, and in each
// object the key being read.
type jsonPath struct{ stack []*jsonFrame }

type jsonFrame struct {
	obj, wantKey bool
	key          string
}

// step takes a delimiter or an object's key and reports true; a value (false) is the caller's,
// who then calls consumed.
func (p *jsonPath) step(tok json.Token) bool {
	if d, ok := tok.(json.Delim); ok {
		switch d {
		case '{', '[':
			p.consumed()
			p.stack = append(p.stack, &jsonFrame{obj: d == '{', wantKey: d == '{'})
		default:
			p.stack = p.stack[:len(p.stack)-1]
		}

		return true
	}

	if len(p.stack) == 0 {
		return true // a scalar at the top (JSON null): nothing to find
	}

	if top := p.stack[len(p.stack)-1]; top.obj && top.wantKey {
		top.key, top.wantKey = tok.(string), false

		return true
	}

	return false
}

// consumed ends a value: the object it was in wants its next key.
func (p *jsonPath) consumed() {
	if n := len(p.stack); n > 0 && p.stack[n-1].obj {
		p.stack[n-1].wantKey = true
	}
}

// at reports whether the value read now is at keys ("" matches any key), from the top.
func (p *jsonPath) at(keys ...string) bool {
	if len(p.stack) != len(keys) {
		return false
	}

	for i, k := range keys {
		if k != "" && p.stack[i].key != k {
			return false
		}
	}

	return true
}

type configDocument = configconfig.Document

// load decodes a Talos machine config.
func load(cfg []byte) (config.Provider, error) {
	p, err := configloader.NewFromBytes(cfg)
	if err != nil {
		return nil, fmt.Errorf("not a Talos machine config: %w", err)
	}

	return p, nil
}

// inspect reports a config's credential digest and form.
func inspect(cfg []byte, registry string) (Pool, error) {
	p, err := load(cfg)
	if err != nil {
		return Pool{}, err
	}

	return Pool{Digest: registryauth.Digest(p, registry), Form: formOf(p, registry)}, nil
}

// formOf is how a config carries the registry's credential.
func formOf(p config.Provider, registry string) string {
	switch {
	case hasDocument(p, registry):
		return FormDocument
	case legacyAuth(p, registry) != nil:
		return FormLegacy
	}

	return FormNone
}

func hasDocument(p config.Provider, registry string) bool {
	return slices.ContainsFunc(p.Documents(), func(d configDocument) bool {
		ra, ok := d.(*cri.RegistryAuthConfigV1Alpha1)

		return ok && ra.Name() == registry
	})
}

func legacyAuth(p config.Provider, registry string) *v1alpha1.RegistryAuthConfig {
	for _, d := range p.Documents() {
		if c, ok := d.(*v1alpha1.Config); ok && c.MachineConfig != nil {
			if rc := c.MachineConfig.MachineRegistries.RegistryConfig[registry]; rc != nil {
				return rc.RegistryAuth
			}
		}
	}

	return nil
}

var separator = regexp.MustCompile(`(?m)^---[ \t]*\r?\n`)

// rewriteConfig replaces the registry's credential in a multi-document machine config: its
// RegistryAuthConfig document, else its legacy machine.registries.config auth (kept in that
// form), else by adding a RegistryAuthConfig document. The other documents are kept as written.
func rewriteConfig(cfg []byte, registry, username, password string) ([]byte, error) {
	p, err := load(cfg)
	if err != nil {
		return nil, err
	}

	bounds := documentBounds(cfg)
	form := formOf(p, registry)

	for i := 0; i+1 < len(bounds); i++ {
		chunk := cfg[bounds[i]:bounds[i+1]]
		head := separator.Find(chunk)
		body := chunk[len(head):]

		var meta struct {
			Kind    string `yaml:"kind"`
			Name    string `yaml:"name"`
			Version string `yaml:"version"`
		}

		if err := yaml.Unmarshal(body, &meta); err != nil {
			continue
		}

		var next []byte

		switch {
		case form == FormDocument && meta.Kind == cri.RegistryAuthConfig && meta.Name == registry:
			next, err = authDocument(registry, username, password)
		case form == FormLegacy && meta.Kind == "" && meta.Version == "v1alpha1":
			next, err = withLegacyAuth(body, registry, username, password)
		default:
			continue
		}

		if err != nil {
			return nil, err
		}

		return slices.Concat(cfg[:bounds[i]], head, next, cfg[bounds[i+1]:]), nil
	}

	if form != FormNone {
		return nil, fmt.Errorf("the config's %s credential for %s was not found in its text", form, registry)
	}

	doc, err := authDocument(registry, username, password)
	if err != nil {
		return nil, err
	}

	out := slices.Clone(cfg)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}

	return slices.Concat(out, []byte("---\n"), doc), nil
}

// documentBounds are the offsets between a multi-document config's documents: document i is
// [bounds[i], bounds[i+1]), the separator before it included.
func documentBounds(cfg []byte) []int {
	bounds := []int{0}
	for _, m := range separator.FindAllIndex(cfg, -1) {
		bounds = append(bounds, m[0])
	}

	return append(bounds, len(cfg))
}

// authDocument encodes the registry's RegistryAuthConfig document.
func authDocument(registry, username, password string) ([]byte, error) {
	auth := cri.NewRegistryAuthConfigV1Alpha1(registry)
	auth.RegistryUsername, auth.RegistryPassword = username, password

	c, err := container.New(auth)
	if err != nil {
		return nil, err
	}

	return c.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// withLegacyAuth sets machine.registries.config.<registry>.auth in a v1alpha1 document, in the
// fields it already uses (auth, or username and password).
func withLegacyAuth(doc []byte, registry, username, password string) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(doc, &root); err != nil || root.Kind != yaml.DocumentNode || len(root.Content) != 1 {
		return nil, fmt.Errorf("the v1alpha1 document does not parse: %v", err)
	}

	auth := lookup(root.Content[0], "machine", "registries", "config", registry, "auth")
	if auth == nil || auth.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("machine.registries.config.%s.auth is not a mapping", registry)
	}

	if v := lookup(auth, "auth"); v != nil {
		v.SetString(base64.StdEncoding.EncodeToString([]byte(username + ":" + password)))
		setOrDelete(auth, "username", "")
		setOrDelete(auth, "password", "")
	} else {
		setOrDelete(auth, "username", username)
		setOrDelete(auth, "password", password)
	}

	var b bytes.Buffer

	enc := yaml.NewEncoder(&b)
	enc.SetIndent(indentOf(doc))

	if err := enc.Encode(root.Content[0]); err != nil {
		return nil, err
	}

	return b.Bytes(), enc.Close()
}

// lookup follows mapping keys.
func lookup(n *yaml.Node, path ...string) *yaml.Node {
	for _, key := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}

		var next *yaml.Node

		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}

		n = next
	}

	return n
}

// setOrDelete sets a string key of a mapping (adding it), or removes it when value is "".
func setOrDelete(m *yaml.Node, key, value string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value != key {
			continue
		}

		if value == "" {
			m.Content = slices.Delete(m.Content, i, i+2)
		} else {
			m.Content[i+1].SetString(value)
		}

		return
	}

	if value != "" {
		k, v := &yaml.Node{}, &yaml.Node{}
		k.SetString(key)
		v.SetString(value)
		m.Content = append(m.Content, k, v)
	}
}

// indentOf is the indentation of the document's first indented line (default 2).
func indentOf(doc []byte) int {
	for _, line := range strings.Split(string(doc), "\n") {
		if trimmed := strings.TrimLeft(line, " "); trimmed != "" && len(trimmed) < len(line) {
			return len(line) - len(trimmed)
		}
	}

	return 2
}

// sameButCredential checks a rewrite: next decodes, carries the wanted credential for registry,
// and equals prev once the registry's credential is taken out of both.
func sameButCredential(prev, next []byte, registry, want string) error {
	a, err := load(prev)
	if err != nil {
		return err
	}

	b, err := load(next)
	if err != nil {
		return err
	}

	if got := registryauth.Digest(b, registry); got != want {
		return fmt.Errorf("it does not carry the new credential for %s", registry)
	}

	ea, err := registryauth.WithoutCredential(a, registry)
	if err != nil {
		return err
	}

	eb, err := registryauth.WithoutCredential(b, registry)
	if err != nil {
		return err
	}

	if !bytes.Equal(ea, eb) {
		return errors.New("it changes more than the registry credential")
	}

	return nil
}

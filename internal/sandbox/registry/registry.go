// Package registry is the sandbox's OCI registry: go-containerregistry's registry behind
// Docker token auth, as ghcr.io is.
package registry

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	mathrand "math/rand"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Registry is a real OCI registry (go-containerregistry's) behind Docker token auth, as
// ghcr.io is: /token trades Basic credentials for a bearer token, and every repository
// under PrivateOrg needs one. Credentials can be added and revoked while it runs.
type Registry struct {
	inner http.Handler
	srv   *http.Server
	addr  string

	mu     sync.Mutex
	users  map[string]string // username -> password
	tokens map[string]grant
	realm  string // the token realm the challenge names ("": its own /token)
	// denied are the repositories a user may log in for but not read ("user repo"), as GHCR
	// grants each package on its own.
	denied map[string]bool
	// public are repositories under PrivateOrg that anyone may pull (Publish), as a GHCR
	// package's visibility is set on its own.
	public map[string]bool
	// expiry is when a user's token expires, sent as GitHub sends it
	// (GitHub-Authentication-Token-Expiration) with every answer to that credential.
	expiry map[string]time.Time
	// flap is a burst of trouble under way (Flap): zero when none.
	flap flap
	// access is the access log (AccessLog).
	access []Access
}

// flap is a burst of the registry's trouble: until then, each request is answered with one of
// answers, drawn from rng.
type flap struct {
	until      time.Time
	answers    []string
	retryAfter time.Duration
	rng        *mathrand.Rand
	served     map[string]int
}

// FlapAnswers are what a flap can answer: 429 Too Many Requests (with Retry-After), 503
// Service Unavailable, and "denied" — 403 DENIED for a token or a manifest, as ghcr.io answers
// everyone during some of its incidents.
var FlapAnswers = []string{"429", "503", "denied"}

// Flap makes the registry answer every request for d with one of answers, drawn at random
// (seeded): ghcr.io's trouble in an incident, for every client — ghcrsync's proofs and the
// runtimes' pulls alike. retryAfter, if set, is sent with 429 and 503. It reports what it
// served once d is over (Served).
func (r *Registry) Flap(d time.Duration, answers []string, retryAfter time.Duration, seed int64) error {
	for _, a := range answers {
		if !slices.Contains(FlapAnswers, a) {
			return fmt.Errorf("registry-flap: %q is not one of %s", a, strings.Join(FlapAnswers, ", "))
		}
	}

	if len(answers) == 0 {
		answers = FlapAnswers
	}

	r.mu.Lock()
	defer r.mu.Unlock()

	r.flap = flap{until: time.Now().Add(d), answers: slices.Clone(answers), retryAfter: retryAfter,
		rng: mathrand.New(mathrand.NewSource(seed)), served: map[string]int{}}

	return nil
}

// Served is how many requests each flap answer has been given to.
func (r *Registry) Served() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()

	out := map[string]int{}
	for k, v := range r.flap.served {
		out[k] = v
	}

	return out
}

// flapped answers req from the flap under way, if there is one and req is one it troubles (a
// denial is for tokens and manifests; the challenge still asks for credentials).
func (r *Registry) flapped(w http.ResponseWriter, req *http.Request) bool {
	r.mu.Lock()
	f := &r.flap

	if f.rng == nil || time.Now().After(f.until) {
		r.mu.Unlock()

		return false
	}

	answer := f.answers[f.rng.Intn(len(f.answers))]
	ping := req.URL.Path == "/v2/" || req.URL.Path == "/v2"

	if answer == "denied" && ping {
		r.mu.Unlock()

		return false
	}

	f.served[answer]++
	retryAfter := f.retryAfter
	r.mu.Unlock()

	switch answer {
	case "429":
		if retryAfter > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int(retryAfter.Seconds())))
		}

		registryError(w, http.StatusTooManyRequests, "TOOMANYREQUESTS", "retry-after: rate limited")
	case "503":
		if retryAfter > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int(retryAfter.Seconds())))
		}

		registryError(w, http.StatusServiceUnavailable, "UNAVAILABLE", "service unavailable")
	default:
		registryError(w, http.StatusForbidden, "DENIED", "requested access to the resource is denied")
	}

	return true
}

// ExpirationHeader is the response header GitHub reports a token's expiry in, formatted
// ExpirationLayout (UTC).
const (
	ExpirationHeader = "GitHub-Authentication-Token-Expiration"
	ExpirationLayout = "2006-01-02 15:04:05 MST"
)

type grant struct {
	user    string // "" for an anonymous token
	expires time.Time
}

// PrivateOrg is the registry namespace whose images need credentials.
const PrivateOrg = "ghcrsync"

// RegistryHost is the host name credentials are keyed by (the dockerconfigjson "auths" key
// and the RegistryAuthConfig name). Pulls of RegistryHost/... are served by the sandbox
// registry, as a Talos registry mirror would route them.
const RegistryHost = "ghcr.io"

// PrivateImages are seeded at start; all need credentials.
var PrivateImages = []string{PrivateOrg + "/private-probe:v1", PrivateOrg + "/app:v1", DistrolessImage}

// PublicImage is seeded too, outside PrivateOrg: anyone pulls it with an anonymous token (as a
// public GHCR package), so a pull of it proves nothing about a credential.
const PublicImage = "public/probe:v1"

// DistrolessImage is a private image with no shell and no /bin/true, whose entrypoint is missing:
// it pulls, but no container of it starts (what a runtime proof by exit code would get wrong).
const DistrolessImage = PrivateOrg + "/distroless-probe:v1"

// Traits are what a runtime finds in an image after pulling it.
type Traits struct {
	NoShell           bool // no /bin/sh, /bin/true…: a command naming them cannot start
	MissingEntrypoint bool // its own entrypoint does not exist
}

// ImageTraits says what is in an image ("org/name:tag", or with the registry host).
func ImageTraits(image string) Traits {
	if repoOf(strings.TrimPrefix(image, RegistryHost+"/")) == repoOf(DistrolessImage) {
		return Traits{NoShell: true, MissingEntrypoint: true}
	}

	return Traits{}
}

// repoOf is an image reference without its tag or digest.
func repoOf(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}

	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		ref = ref[:i]
	}

	return ref
}

// Start seeds the private images and serves the registry on a loopback port.
func Start() (*Registry, error) {
	r := &Registry{
		inner:  ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))),
		users:  map[string]string{},
		tokens: map[string]grant{},
		denied: map[string]bool{}, expiry: map[string]time.Time{},
		public: map[string]bool{},
	}

	if err := r.seed(); err != nil {
		return nil, err
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	r.addr = l.Addr().String()
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}

	go func() { _ = r.srv.Serve(l) }()

	return r, nil
}

// seed pushes the private images straight into the unauthenticated inner handler. Each image's
// content follows from its name: every sandbox's registry serves the same image under the same
// name (with the same digest), as ghcr.io does for every cluster.
func (r *Registry) seed() error {
	return r.push(append(slices.Clone(PrivateImages), PublicImage)...)
}

// write puts one image or index, as put writes it, straight into the unauthenticated inner
// handler under image ("org/name:tag", or with RegistryHost).
func (r *Registry) write(image string, put func(name.Reference) error) error {
	ts := httptest.NewServer(r.inner)
	defer ts.Close()

	ref, err := name.ParseReference(strings.TrimPrefix(ts.URL, "http://")+"/"+strings.TrimPrefix(image, RegistryHost+"/"), name.Insecure)
	if err != nil {
		return err
	}

	return put(ref)
}

// markPublic makes image's repository a public package: anyone pulls it.
func (r *Registry) markPublic(image string) {
	r.mu.Lock()
	r.public[repoOf(strings.TrimPrefix(image, RegistryHost+"/"))] = true
	r.mu.Unlock()
}

// push writes images, each a random image its name seeds, into the inner handler.
func (r *Registry) push(images ...string) error {
	for _, image := range images {
		sum := sha256.Sum256([]byte(image))

		img, err := random.Image(512, 1, random.WithSource(mathrand.NewSource(int64(binary.BigEndian.Uint64(sum[:8])))))
		if err != nil {
			return err
		}

		if err := r.write(image, func(ref name.Reference) error { return remote.Write(ref, img) }); err != nil {
			return fmt.Errorf("sandbox: seed registry image %s: %w", image, err)
		}
	}

	return nil
}

// PushIndex adds a private multi-platform image: an image index of one image per platform
// ("linux/amd64", "linux/arm64/v8"), each with its platform in the index and in its config, as
// `docker buildx build --platform` publishes one.
func (r *Registry) PushIndex(image string, platforms ...string) error {
	var adds []mutate.IndexAddendum

	for i, p := range platforms {
		parts := strings.SplitN(p, "/", 3)
		pl := v1.Platform{OS: parts[0], Architecture: parts[1]}

		if len(parts) == 3 {
			pl.Variant = parts[2]
		}

		img, err := random.Image(256, 1, random.WithSource(mathrand.NewSource(int64(i+1))))
		if err != nil {
			return err
		}

		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}

		cf.OS, cf.Architecture, cf.Variant = pl.OS, pl.Architecture, pl.Variant
		if img, err = mutate.ConfigFile(img, cf); err != nil {
			return err
		}

		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &pl}})
	}

	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)

	return r.write(image, func(ref name.Reference) error { return remote.WriteIndex(ref, idx) })
}

// PushRunnable adds an image a real runtime can run: one layer holding binary at entrypoint's
// path (mode 0755, its folders 0755), entrypoint args, linux and this machine's architecture.
// public makes it a public package (as registry.k8s.io/pause is), else it needs a credential
// like every PrivateOrg image. It returns the image's digest.
func (r *Registry) PushRunnable(image, binary string, entrypoint []string, public bool) (string, error) {
	b, err := os.ReadFile(binary)
	if err != nil {
		return "", err
	}

	var buf bytes.Buffer

	tw := tar.NewWriter(&buf)
	file := strings.TrimPrefix(entrypoint[0], "/")

	var dirs []string
	for d := filepath.Dir(file); d != "."; d = filepath.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}

	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return "", err
		}
	}

	if err := tw.WriteHeader(&tar.Header{Name: file, Mode: 0o755, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}

	if _, err := tw.Write(b); err != nil {
		return "", err
	}

	if err := tw.Close(); err != nil {
		return "", err
	}

	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return "", err
	}

	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}

	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = entrypoint

	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}

	if public {
		r.markPublic(image)
	}

	digest, err := img.Digest()
	if err != nil {
		return "", err
	}

	return digest.String(), r.write(image, func(ref name.Reference) error { return remote.Write(ref, img) })
}

// PushImageIndex adds a multi-platform image as it was built (the shipped image of
// release.ImageIndex), public or private; it returns the index's digest.
func (r *Registry) PushImageIndex(image string, idx v1.ImageIndex, public bool) (string, error) {
	digest, err := idx.Digest()
	if err != nil {
		return "", err
	}

	if public {
		r.markPublic(image)
	}

	return digest.String(), r.write(image, func(ref name.Reference) error { return remote.WriteIndex(ref, idx) })
}

// Push adds private images ("org/name:tag"): only a valid credential pulls them (each user
// all of them, unless DenyRepository takes one away).
func (r *Registry) Push(images ...string) error { return r.push(images...) }

// Publish adds image ("org/name:tag", or with the registry host) as a public package: anyone
// pulls it, even under PrivateOrg (as ghcr.io/ghcrsync/ghcrsync is).
func (r *Registry) Publish(image string) error {
	r.markPublic(image)

	return r.push(strings.TrimPrefix(image, RegistryHost+"/"))
}

// Addr is host:port of the registry (plain HTTP on loopback).
func (r *Registry) Addr() string { return r.addr }

// URL is the registry's base URL.
func (r *Registry) URL() string { return "http://" + r.addr }

// AddCredential makes username/password valid.
func (r *Registry) AddCredential(username, password string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.users[username] = password
}

// RevokeCredential invalidates username and every token issued to it. It reports whether
// the user existed.
func (r *Registry) RevokeCredential(username string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()

	_, ok := r.users[username]
	delete(r.users, username)

	for t, g := range r.tokens {
		if g.user == username {
			delete(r.tokens, t)
		}
	}

	return ok
}

// DenyRepository refuses user reading repository (org/name), though the credential still logs
// in and reads the others: a package not granted to it. AllowRepository undoes it.
func (r *Registry) DenyRepository(user, repository string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.denied[user+" "+repository] = true
}

// AllowRepository undoes DenyRepository.
func (r *Registry) AllowRepository(user, repository string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	delete(r.denied, user+" "+repository)
}

// SetExpiry makes the registry report that user's credential expires at t (zero: it never
// expires, no header). Past t the credential is refused, as GitHub refuses an expired token.
func (r *Registry) SetExpiry(user string, t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()

	if t.IsZero() {
		delete(r.expiry, user)

		return
	}

	r.expiry[user] = t
}

// SetRealm makes the auth challenge name another token realm ("" restores its own): a
// registry, or whoever answers for it, sending the credential elsewhere.
func (r *Registry) SetRealm(realm string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.realm = realm
}

// Close stops the registry.
func (r *Registry) Close(ctx context.Context) { _ = r.srv.Shutdown(ctx) }

func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if (req.URL.Path == "/token" || strings.HasPrefix(req.URL.Path, "/v2")) && r.flapped(w, req) {
		return
	}

	switch {
	case req.URL.Path == "/token":
		r.token(w, req)
	case strings.HasPrefix(req.URL.Path, "/v2"):
		r.v2(w, req)
	default:
		http.NotFound(w, req)
	}
}

// token is the token endpoint as Docker's token spec and real registries serve it, for the two
// ways a client asks:
//
//   - GET with the credential in Basic auth (go-containerregistry, docker), or none for an
//     anonymous token;
//   - POST with an OAuth2 password grant (grant_type=password, username and password in the
//     form), as containerd's resolver asks first. A refresh_token grant is refused (400: this
//     registry hands out no refresh tokens), so a client falls back to its credential.
//
// A credential that is wrong, revoked or expired is refused (401) on both; only a request with
// no credential at all gets an anonymous token.
func (r *Registry) token(w http.ResponseWriter, req *http.Request) {
	var (
		user, pass string
		given      bool
	)

	switch req.Method {
	case http.MethodGet:
		user, pass, given = req.BasicAuth()
	case http.MethodPost:
		if err := req.ParseForm(); err != nil {
			oauthError(w, http.StatusBadRequest, "invalid_request", "the form does not parse")

			return
		}

		switch req.PostForm.Get("grant_type") {
		case "password":
			user, pass, given = req.PostForm.Get("username"), req.PostForm.Get("password"), true
		case "refresh_token":
			oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "refresh tokens are not issued: ask with the credential")

			return
		default:
			oauthError(w, http.StatusBadRequest, "unsupported_grant_type", "grant_type must be password")

			return
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		registryError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "the token endpoint answers GET and POST")

		return
	}

	r.mu.Lock()
	want, known := r.users[user]
	expires, expiring := r.expiry[user]
	r.mu.Unlock()

	if given && (!known || want != pass || (expiring && time.Now().After(expires))) {
		r.record(req, user, "token", http.StatusUnauthorized)
		registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required: invalid username or password")

		return
	}

	if given && expiring {
		w.Header().Set(ExpirationHeader, expires.UTC().Format(ExpirationLayout))
	}

	if !given {
		user = ""
	}

	buf := make([]byte, 24)
	_, _ = rand.Read(buf)
	tok := hex.EncodeToString(buf)

	r.mu.Lock()
	r.tokens[tok] = grant{user: user, expires: time.Now().Add(5 * time.Minute)}
	r.mu.Unlock()

	r.record(req, user, "token", http.StatusOK)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": tok, "access_token": tok, "expires_in": 300, "issued_at": time.Now().UTC().Format(time.RFC3339)})
}

func oauthError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": msg})
}

// Access is one line of the registry's access log: who asked for what, and the answer. The
// password is never kept.
type Access struct {
	Method, Path, UserAgent string
	User                    string // "" for anonymous
	What                    string // "token", "manifest", "blob"
	Status                  int
}

// record appends to the access log (bounded: the last 4096 requests).
func (r *Registry) record(req *http.Request, user, what string, status int) {
	r.mu.Lock()
	defer r.mu.Unlock()

	r.access = append(r.access, Access{Method: req.Method, Path: req.URL.Path, UserAgent: req.UserAgent(), User: user, What: what, Status: status})
	if len(r.access) > 4096 {
		r.access = r.access[len(r.access)-4096:]
	}
}

// AccessLog is what the registry was asked, oldest first.
func (r *Registry) AccessLog() []Access {
	r.mu.Lock()
	defer r.mu.Unlock()

	return slices.Clone(r.access)
}

// ServedManifest reports whether the registry answered a manifest request as user (200) to a
// client whose user agent names agent ("containerd": a real node's runtime, not ghcrsync).
func (r *Registry) ServedManifest(user, agent string) bool {
	return slices.ContainsFunc(r.AccessLog(), func(a Access) bool {
		return a.User == user && a.What == "manifest" && a.Status == http.StatusOK && strings.Contains(strings.ToLower(a.UserAgent), agent)
	})
}

func (r *Registry) v2(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		registryError(w, http.StatusForbidden, "DENIED", "this registry is read-only")

		return
	}

	repo := repository(req.URL.Path)
	r.mu.Lock()
	realm := r.realm
	r.mu.Unlock()

	switch {
	case realm != "":
	case req.URL.IsAbs() && req.URL.Host == RegistryHost:
		// Asked through an HTTP proxy as ghcr.io itself (real Flux's source-controller): its
		// realm is ghcr.io's too, reached the same way — a client refuses a realm on a loopback
		// address it did not ask.
		realm = "http://" + RegistryHost + "/token"
	default:
		realm = "http://" + r.addr + "/token"
	}

	challenge := fmt.Sprintf(`Bearer realm="%s",service="sandbox-registry"`, realm)

	if repo != "" {
		challenge += fmt.Sprintf(`,scope="repository:%s:pull"`, repo)
	}

	tok, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok {
		w.Header().Set("WWW-Authenticate", challenge)
		registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")

		return
	}

	r.mu.Lock()
	g, valid := r.tokens[tok]
	_, userLive := r.users[g.user]
	denied := r.denied[g.user+" "+repo]
	public := r.public[repo]
	r.mu.Unlock()

	what := "manifest"
	if strings.Contains(req.URL.Path, "/blobs/") {
		what = "blob"
	}

	switch {
	case !valid || time.Now().After(g.expires) || (g.user != "" && !userLive):
		r.record(req, g.user, what, http.StatusUnauthorized)
		w.Header().Set("WWW-Authenticate", challenge)
		registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required")

		return
	case g.user == "" && strings.HasPrefix(repo, PrivateOrg+"/") && !public, denied:
		r.record(req, g.user, what, http.StatusForbidden)
		registryError(w, http.StatusForbidden, "DENIED", "requested access to the resource is denied")

		return
	}

	r.record(req, g.user, what, http.StatusOK)
	r.inner.ServeHTTP(w, req)
}

// repository extracts "org/name" from /v2/org/name/{manifests,blobs,tags}/...
func repository(path string) string {
	rest := strings.TrimPrefix(path, "/v2/")
	for _, sep := range []string{"/manifests/", "/blobs/", "/tags/"} {
		if i := strings.Index(rest, sep); i > 0 {
			return rest[:i]
		}
	}

	return ""
}

func registryError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}

// ErrPullDenied marks a pull the registry refused (401/403): a kubelet reports ErrImagePull.
var ErrPullDenied = errors.New("pull access denied")

// Pull fetches an image manifest as a container runtime does: the registry's token dance with
// the given credential (empty = anonymous), and returns its digest. Images outside RegistryHost
// are treated as already present on the machine (pause, system images): no digest.
func (r *Registry) Pull(ctx context.Context, image, username, password string) (string, error) {
	rest, ok := strings.CutPrefix(image, RegistryHost+"/")
	if !ok {
		return "", nil
	}

	ref, err := name.ParseReference(r.addr+"/"+rest, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("invalid image reference %q: %w", image, err)
	}

	auth := authn.Anonymous
	if username != "" || password != "" {
		auth = &authn.Basic{Username: username, Password: password}
	}

	desc, err := remote.Get(ref, remote.WithAuth(auth), remote.WithContext(ctx))

	var terr *transport.Error
	if errors.As(err, &terr) && (terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden) {
		return "", fmt.Errorf("failed to pull and unpack image %q: failed to resolve reference: %w: %d %s",
			image, ErrPullDenied, terr.StatusCode, http.StatusText(terr.StatusCode))
	}

	if errors.As(err, &terr) && terr.StatusCode != 0 { // containerd's words for an answer it cannot use
		return "", fmt.Errorf("failed to pull and unpack image %q: failed to copy: httpReadSeeker: failed open: unexpected status code %s: %d %s",
			image, ref.Context().Name(), terr.StatusCode, http.StatusText(terr.StatusCode))
	}

	if err != nil {
		return "", fmt.Errorf("failed to pull image %q: %w", image, err)
	}

	return desc.Digest.String(), nil
}

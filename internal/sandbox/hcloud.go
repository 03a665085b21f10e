package sandbox

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The fake Hetzner Cloud API the real cluster-autoscaler talks to (HCLOUD_ENDPOINT). It serves
// the calls the autoscaler's Hetzner provider makes (1.33.0, hcloud-go 2.21): list servers,
// server types, images; create a server; poll actions; delete a server. Every machine of the
// fleet is a server; the autoscaled pool's carry the label hcloud/node-group. A created
// server boots a simulated Talos machine from its user data, the pool's cloudInit of
// HCLOUD_CLUSTER_CONFIG: the template ghcrsync rotates. Deleting a server powers its machine
// off, and the sandbox then deletes its Node, as the hcloud cloud-controller-manager does.
const (
	// HcloudNodeGroupLabel is the server label (and Node label) the Hetzner provider groups by.
	HcloudNodeGroupLabel = "hcloud/node-group"
	// HcloudProviderIDPrefix is the Node's spec.providerID prefix of a Hetzner server.
	HcloudProviderIDPrefix = "hcloud://"
	hcloudServerType       = "cx43"
	hcloudLocation         = "fsn1"
	hcloudUserDataMax      = 32 << 10
	// ccmNodeDeleteDelay is how long after a server's deletion the cloud-controller-manager
	// deletes its Node (its node lifecycle controller polls).
	ccmNodeDeleteDelay = 2 * time.Second
)

type hcloudAPI struct {
	f     *Fleet
	token string
	ln    net.Listener
	srv   *http.Server

	mu sync.Mutex
	// dead are servers whose user data no machine would boot: listed as running, they never
	// register a Node (the autoscaler deletes them after --max-node-provision-time).
	dead    map[int64]hcloudServer
	calls   map[string]int
	actions int64
}

type hcloudServer struct {
	ID      int64             `json:"id"`
	Name    string            `json:"name"`
	Status  string            `json:"status"`
	Created time.Time         `json:"created"`
	Labels  map[string]string `json:"labels"`
	// The rest is what hcloud-go decodes without complaint.
	ServerType hcloudServerTypeJSON `json:"server_type"`
	PublicNet  map[string]any       `json:"public_net"`
	PrivateNet []any                `json:"private_net"`
	Datacenter map[string]any       `json:"datacenter"`
}

type hcloudServerTypeJSON struct {
	ID           int64   `json:"id"`
	Name         string  `json:"name"`
	Cores        int     `json:"cores"`
	Memory       float32 `json:"memory"`
	Disk         int     `json:"disk"`
	Architecture string  `json:"architecture"`
	Prices       []struct {
		Location string `json:"location"`
	} `json:"prices"`
}

// cx43 as the sandbox's kubelets report it (4 cores, 8 GiB: their allocatable), in fsn1.
func cx43() hcloudServerTypeJSON {
	t := hcloudServerTypeJSON{ID: 43, Name: hcloudServerType, Cores: 4, Memory: 8, Disk: 160, Architecture: "x86"}
	t.Prices = append(t.Prices, struct {
		Location string `json:"location"`
	}{Location: hcloudLocation})

	return t
}

func startHcloudAPI(f *Fleet) (*hcloudAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	h := &hcloudAPI{f: f, token: newCredential("hcloud").Password, ln: ln, dead: map[int64]hcloudServer{}, calls: map[string]int{}}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/servers", h.listServers)
	mux.HandleFunc("GET /v1/servers/{id}", h.getServer)
	mux.HandleFunc("POST /v1/servers", h.createServer)
	mux.HandleFunc("DELETE /v1/servers/{id}", h.deleteServer)
	mux.HandleFunc("GET /v1/server_types", h.listServerTypes)
	mux.HandleFunc("GET /v1/images", h.listImages)
	mux.HandleFunc("GET /v1/images/{id}", h.getImage)
	mux.HandleFunc("GET /v1/actions", h.listActions)
	mux.HandleFunc("POST /v1/servers/{id}/actions/poweron", h.powerOn)

	h.srv = &http.Server{Handler: h.authorized(mux), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = h.srv.Serve(ln) }()

	return h, nil
}

func (h *hcloudAPI) endpoint() string { return "http://" + h.ln.Addr().String() + "/v1" }

func (h *hcloudAPI) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()

	_ = h.srv.Shutdown(ctx)
}

// Calls counts the requests served, by "METHOD /path" (the path's IDs as {id}).
func (h *hcloudAPI) Calls() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()

	out := make(map[string]int, len(h.calls))
	for k, v := range h.calls {
		out[k] = v
	}

	return out
}

func (h *hcloudAPI) authorized(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(got), []byte(h.token)) != 1 {
			hcloudError(w, http.StatusUnauthorized, "unauthorized", "unable to authenticate")

			return
		}

		h.mu.Lock()
		h.calls[r.Method+" "+hcloudRoute(r.URL.Path)]++
		h.mu.Unlock()

		next.ServeHTTP(w, r)
	})
}

// hcloudRoute replaces numeric path segments with {id}.
func hcloudRoute(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if _, err := strconv.ParseInt(p, 10, 64); err == nil {
			parts[i] = "{id}"
		}
	}

	return strings.Join(parts, "/")
}

func hcloudError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": code, "message": message, "details": nil}})
}

func hcloudMeta(page, perPage, total int) map[string]any {
	last := max(1, (total+perPage-1)/perPage)
	next := any(nil)

	if page < last {
		next = page + 1
	}

	return map[string]any{"pagination": map[string]any{
		"page": page, "per_page": perPage, "next_page": next, "last_page": last, "total_entries": total,
	}}
}

// servers lists every machine as a server, then the dead ones, by ID.
func (h *hcloudAPI) servers() []hcloudServer {
	var out []hcloudServer

	for _, m := range h.f.Machines() {
		s := hcloudServer{ID: m.ServerID, Name: m.Name, Status: "running", Created: m.created, Labels: map[string]string{}}
		if m.Autoscaled {
			s.Labels[HcloudNodeGroupLabel] = TemplatePool
		}

		if m.PoweredOff() {
			s.Status = "off"
		}

		out = append(out, s)
	}

	h.mu.Lock()
	for _, s := range h.dead {
		out = append(out, s)
	}
	h.mu.Unlock()

	for i := range out {
		out[i].ServerType = cx43()
		out[i].PublicNet = map[string]any{"ipv4": nil, "ipv6": nil, "floating_ips": []any{}, "firewalls": []any{}}
		out[i].PrivateNet = []any{}
		out[i].Datacenter = map[string]any{"id": 1, "name": hcloudLocation + "-dc14", "location": map[string]any{"id": 1, "name": hcloudLocation}}
	}

	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })

	return out
}

func (h *hcloudAPI) listServers(w http.ResponseWriter, r *http.Request) {
	all := h.servers()

	if name := r.URL.Query().Get("name"); name != "" {
		var named []hcloudServer

		for _, s := range all {
			if s.Name == name {
				named = append(named, s)
			}
		}

		all = named
	}

	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	perPage, _ := strconv.Atoi(r.URL.Query().Get("per_page"))

	page, perPage = max(page, 1), min(max(perPage, 1), 50)
	if r.URL.Query().Get("per_page") == "" {
		perPage = 25
	}

	from, to := min((page-1)*perPage, len(all)), min(page*perPage, len(all))
	writeJSON(w, http.StatusOK, map[string]any{"servers": all[from:to], "meta": hcloudMeta(page, perPage, len(all))})
}

func (h *hcloudAPI) serverByID(r *http.Request) (hcloudServer, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return hcloudServer{}, false
	}

	for _, s := range h.servers() {
		if s.ID == id {
			return s, true
		}
	}

	return hcloudServer{}, false
}

func (h *hcloudAPI) getServer(w http.ResponseWriter, r *http.Request) {
	s, ok := h.serverByID(r)
	if !ok {
		hcloudError(w, http.StatusNotFound, "not_found", "server not found")

		return
	}

	writeJSON(w, http.StatusOK, map[string]any{"server": s})
}

func (h *hcloudAPI) listServerTypes(w http.ResponseWriter, r *http.Request) {
	types := []hcloudServerTypeJSON{cx43()}
	if name := r.URL.Query().Get("name"); name != "" && name != hcloudServerType {
		types = nil
	}

	writeJSON(w, http.StatusOK, map[string]any{"server_types": types, "meta": hcloudMeta(1, 50, len(types))})
}

// The one image: the name the template's imagesForArch.amd64 gives ("talos-<tag>").
func (h *hcloudAPI) image() map[string]any {
	tag, _ := talosTagFor(h.f.opts.TalosVersion, 0)

	return map[string]any{
		"id": 1, "type": "snapshot", "status": "available", "name": "talos-" + tag, "description": "Talos " + tag,
		"architecture": "x86", "os_flavor": "unknown", "disk_size": 20, "labels": map[string]string{"os": "talos"},
		"protection": map[string]any{"delete": false}, "created": h.f.started.UTC().Format(time.RFC3339),
	}
}

func (h *hcloudAPI) listImages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	img := h.image()

	var images []map[string]any
	if (q.Get("name") == "" || q.Get("name") == img["name"]) && (q.Get("architecture") == "" || q.Get("architecture") == "x86") {
		images = append(images, img)
	}

	writeJSON(w, http.StatusOK, map[string]any{"images": images, "meta": hcloudMeta(1, 50, len(images))})
}

func (h *hcloudAPI) getImage(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") != "1" {
		hcloudError(w, http.StatusNotFound, "not_found", "image not found")

		return
	}

	writeJSON(w, http.StatusOK, map[string]any{"image": h.image()})
}

// newAction is a new action on the server, finished at once.
func (h *hcloudAPI) newAction(command string, server int64) map[string]any {
	h.mu.Lock()
	h.actions++
	id := h.actions
	h.mu.Unlock()

	return action(id, command, server)
}

func action(id int64, command string, server int64) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)

	return map[string]any{
		"id": id, "command": command, "status": "success", "progress": 100, "started": now, "finished": now, "error": nil,
		"resources": []map[string]any{{"id": server, "type": "server"}},
	}
}

// listActions: every action finishes at once (the autoscaler polls only running ones).
func (h *hcloudAPI) listActions(w http.ResponseWriter, r *http.Request) {
	var actions []map[string]any

	for _, v := range r.URL.Query()["id"] {
		id, _ := strconv.ParseInt(v, 10, 64)
		actions = append(actions, action(id, "", 0))
	}

	writeJSON(w, http.StatusOK, map[string]any{"actions": actions, "meta": hcloudMeta(1, 50, len(actions))})
}

type hcloudCreateRequest struct {
	Name       string            `json:"name"`
	ServerType json.RawMessage   `json:"server_type"`
	Location   string            `json:"location"`
	UserData   string            `json:"user_data"`
	Labels     map[string]string `json:"labels"`
}

// createServer boots a machine named after the server from its user data. A config no machine
// would boot still makes a server (Hetzner does not read user data), one that never joins.
func (h *hcloudAPI) createServer(w http.ResponseWriter, r *http.Request) {
	var req hcloudCreateRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		hcloudError(w, http.StatusBadRequest, "invalid_input", "invalid JSON: "+err.Error())

		return
	}

	switch {
	case req.Name == "":
		hcloudError(w, http.StatusBadRequest, "invalid_input", "name is required")

		return
	case len(req.UserData) > hcloudUserDataMax:
		hcloudError(w, http.StatusBadRequest, "invalid_input", fmt.Sprintf("user_data is %d bytes, more than %d", len(req.UserData), hcloudUserDataMax))

		return
	case req.Location != "" && req.Location != hcloudLocation:
		hcloudError(w, http.StatusUnprocessableEntity, "resource_unavailable", "server type not available in "+req.Location)

		return
	}

	if _, taken := h.f.Machine(req.Name); taken {
		hcloudError(w, http.StatusConflict, "uniqueness_error", "server name is already used")

		return
	}

	autoscaled := req.Labels[HcloudNodeGroupLabel] == TemplatePool

	var s hcloudServer

	m, err := h.boot(r.Context(), req.Name, autoscaled, []byte(req.UserData))
	if err != nil {
		h.f.log.Info("hcloud: a server's user data boots no machine: it will never join", "server", req.Name, "error", err)

		s = hcloudServer{ID: h.f.newServerID(), Name: req.Name, Status: "running", Created: time.Now(), Labels: req.Labels}
		h.mu.Lock()
		h.dead[s.ID] = s
		h.mu.Unlock()
	} else {
		s = hcloudServer{ID: m.ServerID, Name: m.Name, Status: "running", Created: m.created, Labels: req.Labels}
		h.f.log.Info("hcloud: server created", "server", m.Name, "id", m.ServerID, "credential", m.Effective().Username)
	}

	s.ServerType = cx43()
	writeJSON(w, http.StatusCreated, map[string]any{
		"server": s, "action": h.newAction("create_server", s.ID), "next_actions": []any{h.newAction("start_server", s.ID)}, "root_password": nil,
	})
}

func (h *hcloudAPI) boot(ctx context.Context, name string, autoscaled bool, userData []byte) (*Machine, error) {
	if err := bootable(userData); err != nil {
		return nil, err
	}

	return h.f.addMachine(context.WithoutCancel(ctx), name, RoleWorker, autoscaled, Credential{}, userData)
}

// deleteServer powers the machine off at once and, a moment later, deletes its Node as the
// cloud-controller-manager does. The action is returned before either (it is not waited on).
func (h *hcloudAPI) deleteServer(w http.ResponseWriter, r *http.Request) {
	s, ok := h.serverByID(r)
	if !ok {
		hcloudError(w, http.StatusNotFound, "not_found", "server not found")

		return
	}

	h.mu.Lock()
	_, dead := h.dead[s.ID]
	delete(h.dead, s.ID)
	h.mu.Unlock()

	if !dead {
		if m, ok := h.f.Machine(s.Name); ok {
			h.f.log.Info("hcloud: server deleted", "server", s.Name, "id", s.ID)
			h.f.removeMachine(m)
			h.f.ccmDeleteNode(s.Name, ccmNodeDeleteDelay)
		}
	}

	writeJSON(w, http.StatusOK, map[string]any{"action": h.newAction("delete_server", s.ID)})
}

func (h *hcloudAPI) powerOn(w http.ResponseWriter, r *http.Request) {
	s, ok := h.serverByID(r)
	if !ok {
		hcloudError(w, http.StatusNotFound, "not_found", "server not found")

		return
	}

	writeJSON(w, http.StatusCreated, map[string]any{"action": h.newAction("start_server", s.ID)})
}

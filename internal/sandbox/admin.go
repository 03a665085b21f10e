package sandbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// adminAPI is the loopback fault-injection API `ghcrsync-sandbox ctl` talks to.
type adminAPI struct {
	srv  *http.Server
	addr string
}

// Request is the body of a POST to the admin API.
type Request struct {
	Node string `json:"node,omitempty"`
	User string `json:"user,omitempty"`
	// Repository is a registry repository, "org/name" (deny-repository, allow-repository).
	Repository string `json:"repository,omitempty"`
	ID         string `json:"id,omitempty"`
	Attempt    string `json:"attempt,omitempty"`
	Status     string `json:"status,omitempty"`
	// Duration is how long a fault lasts (api-outage), as a Go duration.
	Duration string `json:"duration,omitempty"`
	// Alarm is the etcd alarm a control plane raises (etcd-alarm): NOSPACE, CORRUPT, or "" to clear.
	Alarm string `json:"alarm,omitempty"`
	// Since is where a report starts (disruption), RFC 3339.
	Since string `json:"since,omitempty"`
	// To is the machine whose address a Node is moved to (move-address; "" moves it back).
	To string `json:"to,omitempty"`
	// IPs are the InternalIPs a Node's kubelet reports (report-ips): nil its own, empty none.
	IPs []string `json:"ips"`
	// Answers are what a troubled registry answers (registry-flap): 429, 503, denied; none: all.
	Answers []string `json:"answers,omitempty"`
	// RetryAfter is the Retry-After a troubled registry sends with 429 and 503, a Go duration.
	RetryAfter string `json:"retry_after,omitempty"`
}

// Verbs the admin API serves (POST /v1/VERB), and `ctl` accepts.
var Verbs = []string{
	"reboot", "power-off", "power-on", "scale-down", "scale-up", "delete-node", "pause-autoscaler", "resume-autoscaler",
	"revoke-credential", "deny-repository", "allow-repository", "set-run-status", "stats", "fleet", "hang-talos", "unhang-talos", "slow-talos", "api-outage", "rotate-secret",
	"etcd-alarm", "etcd-learner", "etcd-voter", "move-address", "report-ips", "lose-answers", "lose-talos-answers", "stall-pods", "unstall-pods", "kubelet-not-ready", "kubelet-ready",
	"disruption", "registry-flap",
}

func startAdminAPI(s *Sandbox) (*adminAPI, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{verb}", func(w http.ResponseWriter, r *http.Request) {
		var req Request
		if r.ContentLength != 0 {
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request body: " + err.Error()})

				return
			}
		}

		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Minute)
		defer cancel()

		out, err := s.Do(ctx, r.PathValue("verb"), req)
		if err != nil {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": err.Error()})

			return
		}

		writeJSON(w, http.StatusOK, out)
	})

	a := &adminAPI{addr: l.Addr().String(), srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}}

	go func() { _ = a.srv.Serve(l) }()

	return a, nil
}

func (a *adminAPI) url() string { return "http://" + a.addr }

func (a *adminAPI) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = a.srv.Shutdown(ctx)
}

// scaleUp is a scale-up of the autoscaler; with joinAfter, its server is created now (from the
// template the autoscaler holds now) and its Node joins after that long, as a real server's
// provisioning and boot: meanwhile the autoscaler's status counts it as target, not registered.
func (s *Sandbox) scaleUp(ctx context.Context, joinAfter string) (any, error) {
	if joinAfter != "" {
		d, err := time.ParseDuration(joinAfter)
		if err != nil {
			return nil, fmt.Errorf("scale-up: %w", err)
		}

		name, err := s.autoscaler.provision(d)
		if err != nil {
			return nil, err
		}

		return map[string]string{"provisioning": name, "joins_after": d.String()}, nil
	}

	m, err := s.autoscaler.scaleUp(ctx)
	if err != nil {
		return nil, err
	}

	if err := s.WaitNodesReady(ctx, time.Minute); err != nil {
		return nil, err
	}

	return map[string]string{"added": m.Name}, nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// MachineInfo describes one machine for `ctl fleet` and `make demo`.
type MachineInfo struct {
	Name         string `json:"name"`
	Role         string `json:"role"`
	Autoscaled   bool   `json:"autoscaled"`
	IP           string `json:"ip"`
	TalosVersion string `json:"talos_version"`
	BootID       string `json:"boot_id"`
	Configured   string `json:"configured_credential"` // a username: never a secret
	Effective    string `json:"effective_credential"`
	InSync       bool   `json:"in_sync_with_secret_file"`
	Endpoint     bool   `json:"api_endpoint"`
	Real         bool   `json:"real_node"` // a real containerd and kubelet
}

// Fleet describes the machines.
func (s *Sandbox) FleetInfo() []MachineInfo {
	var out []MachineInfo

	for _, m := range s.fleet.Machines() {
		conf, eff := m.Configured(), m.Effective()
		out = append(out, MachineInfo{
			Name: m.Name, Role: string(m.Role), Autoscaled: m.Autoscaled, IP: m.IP, TalosVersion: m.TalosTag,
			BootID: m.BootID(), Configured: conf.Username, Effective: eff.Username,
			InSync:   conf == s.NewCredential() && eff == s.NewCredential(),
			Endpoint: s.fleet.endpoint.owner == m.Name, Real: m.Real(),
		})
	}

	return out
}

// Do performs one admin verb. It is what the admin API and in-process tests call.
func (s *Sandbox) Do(ctx context.Context, verb string, req Request) (any, error) {
	machine := func() (*Machine, error) {
		m, ok := s.fleet.Machine(req.Node)
		if !ok {
			return nil, fmt.Errorf("no machine %q", req.Node)
		}

		return m, nil
	}

	switch verb {
	case "stats":
		return s.fleet.Stats(), nil
	case "disruption":
		since, err := time.Parse(time.RFC3339Nano, req.Since)
		if err != nil {
			return nil, fmt.Errorf("disruption: since %q is not an RFC 3339 time", req.Since)
		}

		return s.Disruption(since, DemoNamespaces)
	case "fleet":
		return s.FleetInfo(), nil
	case "reboot":
		// An out-of-band reboot (power button, provider maintenance) by a third party.
		m, err := machine()
		if err != nil {
			return nil, err
		}

		m.reboot("ctl reboot", "", true)

		return map[string]string{"rebooting": m.Name}, nil
	case "power-off", "power-on":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		if verb == "power-off" {
			m.PowerOff()
		} else {
			m.PowerOn()
		}

		return map[string]string{verb: m.Name}, nil
	case "scale-down", "scale-up":
		if s.real != nil {
			return nil, errRealAutoscaler
		}

		if verb == "scale-up" {
			return s.scaleUp(ctx, req.Duration)
		}

		if err := s.autoscaler.scaleDown(ctx, req.Node, true); err != nil {
			return nil, err
		}

		return map[string]string{"deleted": req.Node}, nil
	case "delete-node":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		s.fleet.removeMachine(m)

		if err := s.Kube().CoreV1().Nodes().Delete(ctx, m.Name, deleteOpts); err != nil {
			return nil, err
		}

		return map[string]string{"deleted": m.Name}, nil
	case "pause-autoscaler":
		s.pauseAutoscaler(true)

		return map[string]bool{"paused": true}, nil
	case "resume-autoscaler":
		s.pauseAutoscaler(false)

		return map[string]bool{"paused": false}, nil
	case "revoke-credential":
		if !s.registry.RevokeCredential(req.User) {
			return nil, fmt.Errorf("no registry credential for user %q", req.User)
		}

		return map[string]string{"revoked": req.User}, nil
	case "registry-flap":
		d, err := time.ParseDuration(req.Duration)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("registry-flap needs a positive duration, e.g. 30s: %q", req.Duration)
		}

		var retryAfter time.Duration
		if req.RetryAfter != "" {
			if retryAfter, err = time.ParseDuration(req.RetryAfter); err != nil {
				return nil, fmt.Errorf("registry-flap: retry-after: %w", err)
			}
		}

		if err := s.registry.Flap(d, req.Answers, retryAfter, time.Now().UnixNano()); err != nil {
			return nil, err
		}

		return map[string]any{"flapping_for": d.String(), "answers": req.Answers}, nil
	case "deny-repository", "allow-repository":
		if req.User == "" || !strings.Contains(req.Repository, "/") {
			return nil, fmt.Errorf("%s needs a user and a repository org/name", verb)
		}

		if verb == "deny-repository" {
			s.registry.DenyRepository(req.User, req.Repository)
		} else {
			s.registry.AllowRepository(req.User, req.Repository)
		}

		return map[string]string{verb: req.User + " " + req.Repository}, nil
	case "etcd-alarm", "etcd-learner", "etcd-voter":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		if m.Role != RoleControlPlane {
			return nil, fmt.Errorf("%s is not a control plane: it has no etcd member", m.Name)
		}

		learner, alarm := m.etcd()

		switch verb {
		case "etcd-alarm":
			if req.Alarm != "" && req.Alarm != "NOSPACE" && req.Alarm != "CORRUPT" {
				return nil, fmt.Errorf("unknown etcd alarm %q: NOSPACE, CORRUPT, or empty to clear", req.Alarm)
			}

			alarm = req.Alarm
		case "etcd-learner":
			learner = true
		default:
			learner = false
		}

		m.SetEtcd(learner, alarm)

		return map[string]any{"node": m.Name, "learner": learner, "alarm": alarm}, nil
	case "lose-answers": // the API endpoint cuts every answer on its way back, for a while
		d, err := time.ParseDuration(req.Duration)
		if err != nil {
			return nil, fmt.Errorf("lose-answers needs a duration: %w", err)
		}

		s.fleet.endpoint.loseAnswers(d)

		return map[string]string{"losing_answers_for": d.String()}, nil
	case "lose-talos-answers": // the machine's next Talos write is carried out, its answer lost
		m, err := machine()
		if err != nil {
			return nil, err
		}

		m.LoseAnswers(1)

		return map[string]string{"node": m.Name}, nil
	case "move-address":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		ip := ""
		if req.To != "" {
			to, ok := s.fleet.Machine(req.To)
			if !ok {
				return nil, fmt.Errorf("no machine %q", req.To)
			}

			ip = to.IP
		}

		m.ReportIP(ip)

		return map[string]string{"node": m.Name, "internal_ip": m.internalIP()}, nil
	case "report-ips":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		for _, ip := range req.IPs {
			if _, err := netip.ParseAddr(ip); err != nil {
				return nil, fmt.Errorf("report-ips: %q is not an IP address", ip)
			}
		}

		m.ReportIPs(req.IPs)

		return map[string]any{"node": m.Name, "internal_ips": m.internalIPs()}, nil
	case "kubelet-not-ready", "kubelet-ready":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		why := ""
		if verb == "kubelet-not-ready" {
			why = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
		}

		m.SetNotReady(why)

		return map[string]bool{m.Name: why == ""}, nil
	case "stall-pods", "unstall-pods":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		m.StallPods(verb == "stall-pods")

		return map[string]bool{m.Name: verb == "stall-pods"}, nil
	case "hang-talos", "unhang-talos":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		m.SetHung(verb == "hang-talos")

		return map[string]bool{m.Name: verb == "hang-talos"}, nil
	case "rotate-secret":
		c, err := s.RotateSecret(fmt.Sprintf("rotated-%d", time.Now().UnixNano()))
		if err != nil {
			return nil, err
		}

		return map[string]string{"new_credential_user": c.Username, "old_credential_user": s.OldCredential().Username}, nil
	case "slow-talos":
		m, err := machine()
		if err != nil {
			return nil, err
		}

		d, err := time.ParseDuration(req.Duration)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("slow-talos needs a latency like 2s (0s: answer at once): %q", req.Duration)
		}

		m.SetLatency(d)

		return map[string]string{m.Name: d.String()}, nil
	case "api-outage":
		d, err := time.ParseDuration(req.Duration)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("api-outage needs a duration like 8s: %q", req.Duration)
		}

		s.fleet.endpoint.outage(d)

		return map[string]string{"api-outage": d.String()}, nil
	case "set-run-status":
		if req.ID == "" || req.Attempt == "" || req.Status == "" {
			return nil, fmt.Errorf("set-run-status needs ID ATTEMPT STATUS")
		}

		s.ci.SetRunStatus(req.ID, req.Attempt, req.Status)

		return map[string]string{"run": req.ID + "/" + req.Attempt, "status": req.Status}, nil
	}

	return nil, fmt.Errorf("unknown verb %q (one of %v)", verb, Verbs)
}

// Info is DIR/sandbox.json: how `ctl` and `down` find a running sandbox.
type Info struct {
	PID              int    `json:"pid"`
	Admin            string `json:"admin_url"`
	Registry         string `json:"registry_url"`
	CIAPI            string `json:"ci_api_url"`
	APIEndpoint      string `json:"api_endpoint"`
	TalosEndpoint    string `json:"talos_endpoint"`
	OldCredential    string `json:"old_credential_user"`
	NewCredential    string `json:"new_credential_user"`
	ControlPlanePIDs []int  `json:"control_plane_pids"`
}

func (s *Sandbox) writeInfo() error {
	if err := s.writeEnv(); err != nil {
		return err
	}

	b, err := json.MarshalIndent(Info{
		PID: os.Getpid(), Admin: s.admin.url(), Registry: s.registry.URL(), CIAPI: s.ci.url(),
		APIEndpoint: s.fleet.endpoint.url(), TalosEndpoint: s.talosAddr,
		OldCredential: s.OldCredential().Username, NewCredential: s.NewCredential().Username,
		ControlPlanePIDs: s.cp.pids(),
	}, "", "  ")
	if err != nil {
		return err
	}

	return os.WriteFile(filepath.Join(s.opts.Dir, InfoFile), append(b, '\n'), 0o600)
}

// ReadInfo reads DIR/sandbox.json.
func ReadInfo(dir string) (Info, error) {
	var info Info

	b, err := os.ReadFile(filepath.Join(dir, InfoFile))
	if err != nil {
		return info, fmt.Errorf("no sandbox in %s (%w): start one with `ghcrsync-sandbox up --dir %s`", dir, err, dir)
	}

	return info, json.Unmarshal(b, &info)
}

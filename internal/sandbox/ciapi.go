package sandbox

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ciAPI fakes the GitHub Actions "run attempt" endpoint:
// GET /repos/{owner}/{repo}/actions/runs/{id}/attempts/{n} -> {"status": ...}.
// Statuses are set at run time; an unknown attempt is 404 as on GitHub; the status "none"
// (NoStatus) answers without one.
type ciAPI struct {
	srv  *http.Server
	addr string

	mu     sync.Mutex
	status map[string]string // "id/attempt" -> status
}

func startCIAPI() (*ciAPI, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}

	c := &ciAPI{addr: l.Addr().String(), status: map[string]string{}}
	c.srv = &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}

	go func() { _ = c.srv.Serve(l) }()

	return c, nil
}

func (c *ciAPI) url() string { return "http://" + c.addr }

// SetRunStatus sets the status of run id's attempt (queued, in_progress, completed, ...).
func (c *ciAPI) SetRunStatus(id, attempt, status string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status[id+"/"+attempt] = status
}

func (c *ciAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// /repos/{owner}/{repo}/actions/runs/{id}/attempts/{n}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 8 || parts[0] != "repos" || parts[3] != "actions" ||
		parts[4] != "runs" || parts[6] != "attempts" {
		http.NotFound(w, r)

		return
	}

	c.mu.Lock()
	st, ok := c.status[parts[5]+"/"+parts[7]]
	c.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")

	if !ok {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"message": "Not Found"})

		return
	}

	id, _ := strconv.ParseInt(parts[5], 10, 64)
	attempt, _ := strconv.Atoi(parts[7])
	answer := map[string]any{"id": id, "run_attempt": attempt, "status": st}

	if st == NoStatus {
		delete(answer, "status") // an answer that says nothing of the run's state
	}

	_ = json.NewEncoder(w).Encode(answer)
}

// NoStatus, set as a run attempt's status, makes the CI API answer for it without a status.
const NoStatus = "none"

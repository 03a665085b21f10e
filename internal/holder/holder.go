// Package holder is the one format of a run's holder id, the identity written into the run
// Lease, the node owner annotations and the state: built here, parsed here.
//
// The id is six fields joined by "-": the credential revision (16 hex), the run reference
// (gh<run id>.<attempt> in GitHub Actions, else explicit, else "local"), the host name, the
// process id, a random nonce, and the process identity (process.go: boot id, PID namespace,
// start time), which an older ghcrsync did not write (its ids have five fields). A field's own "-" and "%" are escaped (%2D, %25), so a run
// reference or host name of any shape parses back exactly.
package holder

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ID is a parsed holder id.
type ID struct {
	Revision string
	RunRef   string
	Host     string
	PID      int
	Nonce    string
	// Proc is the process identity (Process), "" in an id of an older ghcrsync or where /proc
	// cannot tell: then the host name and pid are no proof of which process it was.
	Proc string
}

// New makes this process's holder id for a run of revision.
func New(revision, runRef string) ID {
	host, _ := os.Hostname()
	if len(revision) > 16 {
		revision = revision[:16]
	}

	b := make([]byte, 3)
	_, _ = rand.Read(b)

	return ID{Revision: revision, RunRef: RunRef(runRef), Host: host, PID: os.Getpid(), Nonce: hex.EncodeToString(b), Proc: Process()}
}

// RunRef is explicit if set, else gh<GITHUB_RUN_ID>.<GITHUB_RUN_ATTEMPT> in GitHub Actions,
// else pod:NAMESPACE/NAME/UID in a pod that names itself (the downward API, PodNameEnv …), else
// "local".
func RunRef(explicit string) string {
	if explicit != "" {
		return explicit
	}

	if id := os.Getenv("GITHUB_RUN_ID"); id != "" {
		attempt := os.Getenv("GITHUB_RUN_ATTEMPT")
		if attempt == "" {
			attempt = "1"
		}

		return "gh" + id + "." + attempt
	}

	if ref := podRunRef(); ref != "" {
		return ref
	}

	return "local"
}

// The downward API's names for the pod a run is in (docs/deploy/job.yaml sets them): its run ref
// is then pod:NAMESPACE/NAME/UID, and a later run can ask the API server whether that pod is over
// (cluster.PodLiveness).
const (
	PodNamespaceEnv = "GHCRSYNC_POD_NAMESPACE"
	PodNameEnv      = "GHCRSYNC_POD_NAME"
	PodUIDEnv       = "GHCRSYNC_POD_UID"
)

func podRunRef() string {
	ns, name, uid := os.Getenv(PodNamespaceEnv), os.Getenv(PodNameEnv), os.Getenv(PodUIDEnv)
	if ns == "" || name == "" || uid == "" || strings.Contains(ns+name+uid, "/") {
		return ""
	}

	return "pod:" + ns + "/" + name + "/" + uid
}

// ParsePodRef reads a run ref pod:NAMESPACE/NAME/UID.
func ParsePodRef(ref string) (ns, name, uid string, ok bool) {
	rest, ok := strings.CutPrefix(ref, "pod:")
	if !ok {
		return "", "", "", false
	}

	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}

	return parts[0], parts[1], parts[2], true
}

var escaper = strings.NewReplacer("%", "%25", "-", "%2D")

// String is the holder id.
func (id ID) String() string {
	fields := []string{
		escaper.Replace(id.Revision), escaper.Replace(id.RunRef), escaper.Replace(id.Host),
		strconv.Itoa(id.PID), escaper.Replace(id.Nonce),
	}

	if id.Proc != "" {
		fields = append(fields, escaper.Replace(id.Proc))
	}

	return strings.Join(fields, "-")
}

// Parse reads a holder id. ok is false for anything not made by String (a foreign holder).
func Parse(s string) (id ID, ok bool) {
	parts := strings.Split(s, "-")
	if len(parts) != 5 && len(parts) != 6 {
		return ID{}, false
	}

	for i, p := range parts {
		u, err := unescape(p)
		if err != nil {
			return ID{}, false
		}

		parts[i] = u
	}

	pid, err := strconv.Atoi(parts[3])
	if err != nil || pid <= 0 {
		return ID{}, false
	}

	id = ID{Revision: parts[0], RunRef: parts[1], Host: parts[2], PID: pid, Nonce: parts[4]}

	if len(parts) == 6 {
		if _, _, ok := ProcessParts(parts[5]); !ok {
			return ID{}, false
		}

		id.Proc = parts[5]
	}

	return id, true
}

func unescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}

	var b strings.Builder

	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])

			continue
		}

		switch {
		case strings.HasPrefix(s[i:], "%25"):
			b.WriteByte('%')
		case strings.HasPrefix(s[i:], "%2D"):
			b.WriteByte('-')
		default:
			return "", fmt.Errorf("bad escape in %q", s)
		}

		i += 2
	}

	return b.String(), nil
}

package plan

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ghcrsync/ghcrsync/internal/human"
)

// Secret roles.
const (
	RoleConsumer = "consumer"
	RoleRoot     = "root"
	// RoleTemplate is a node template's role in the fan-out's results and the state's records.
	RoleTemplate = "node-template"
)

// SecretObs is an observed target pull secret.
type SecretObs struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	// Credential is the tenant credential it holds ("": the cluster credential).
	Credential       string `json:"credential,omitempty"`
	NamespaceMissing bool   `json:"namespace_missing,omitempty"`
	Exists           bool   `json:"exists"`
	Type             string `json:"type,omitempty"`
	Digest           string `json:"digest,omitempty"`  // hex SHA-256 of its .dockerconfigjson
	Foreign          string `json:"foreign,omitempty"` // why another controller owns it
	// OtherConfiguration names another ghcrsync configuration whose mark it carries (listed
	// among the other owners; it is still written).
	OtherConfiguration string   `json:"other_configuration,omitempty"`
	MissingFrom        []string `json:"missing_from,omitempty"`
	// Writers are the other field managers of its credential key.
	Writers []Writer `json:"writers,omitempty"`
	// WriteRefused is the API server's refusal of a server-side dry run of apply's write of it
	// (admission or validation), "" when admitted or not tried.
	WriteRefused string `json:"write_refused,omitempty"`
	// OutsideRoles: its namespace carries the consumer label, but ghcrsync's roles grant nothing
	// there (rendered before the label came): it was not read, and is not written.
	OutsideRoles bool `json:"outside_roles,omitempty"`
	// Contested are the credentials whose consumer selectors all match its namespace with the
	// same secret name (the cluster credential as ""): it was not read, and is not written.
	Contested []string `json:"contested,omitempty"`
	// Moved: it carries the mark of another credential of this configuration, MovedFrom (the
	// cluster credential as ""): its namespace was moved to Credential since it was written.
	// MoveDeclared: the roles in force were rendered with the move (a reviewed change); until
	// then it is not written.
	Moved        bool   `json:"moved,omitempty"`
	MovedFrom    string `json:"moved_from,omitempty"`
	MoveDeclared bool   `json:"move_declared,omitempty"`
}

// JudgedBy reports whether the secret counts in the verdict on credential (the cluster
// credential as ""): its own, and while it is contested or moving, every credential concerned
// (a moving secret holds the credential it moves from until it is written).
func (s SecretObs) JudgedBy(credential string) bool {
	return s.Credential == credential || (s.Moved && s.MovedFrom == credential) || slices.Contains(s.Contested, credential)
}

// ContestedSentence says why a pull secret two credentials name was neither read nor written.
func (s SecretObs) ContestedSentence() string {
	names := make([]string, len(s.Contested))
	for i, c := range s.Contested {
		names[i] = credentialName(c)
	}

	return s.Namespace + "/" + s.Name + " is a consumer of " + strings.Join(names, " and of ") + " (their consumer selectors all match namespace " +
		s.Namespace + "): a pull secret holds one credential; it was not read and is not written. Change the namespace's labels or a selector so one credential names it"
}

// MoveSentence says why a pull secret moved to another credential is not written.
func (s SecretObs) MoveSentence() string {
	return s.Namespace + "/" + s.Name + " holds " + credentialName(s.MovedFrom) + " (its ghcrsync.dev/credential mark), but its namespace now selects " +
		credentialName(s.Credential) + ": moving a namespace between credentials is a reviewed change, so nothing is written there. " +
		"To move it, render the roles again (ghcrsync rbac), review and apply them; to keep it, restore the namespace's labels"
}

// credentialName names a credential, the cluster credential as "".
func credentialName(name string) string {
	if name == "" {
		return "the cluster credential"
	}

	return "credential " + strconv.Quote(name)
}

// OutsideRolesSentence says why a consumer was neither read nor written, and what to do.
func (s SecretObs) OutsideRolesSentence() string {
	return "namespace " + s.Namespace + " carries the consumer label, but ghcrsync's roles grant nothing there (it was labelled after " +
		"`ghcrsync rbac` was rendered): " + s.Namespace + "/" + s.Name + " was not read and is not written; render the roles again to include it"
}

// Writer is a field manager other than ghcrsync that owns an object's credential field.
type Writer struct {
	Manager   string    `json:"manager"`
	Operation string    `json:"operation,omitempty"` // Apply or Update
	At        time.Time `json:"at,omitzero"`
}

// SecretAction is what the plan does to a pull secret.
type SecretAction string

const (
	SecretCreate SecretAction = "create"
	SecretUpdate SecretAction = "update"
	SecretNoOp   SecretAction = "no-op"
	SecretSkip   SecretAction = "skip"
)

// SecretPlan is one pull secret's action.
type SecretPlan struct {
	Namespace string `json:"namespace"`
	Secret    string `json:"secret"`
	Role      string `json:"role"`
	// Credential is the tenant credential it receives ("": the cluster credential).
	Credential      string       `json:"credential,omitempty"`
	Action          SecretAction `json:"action"`
	Reason          string       `json:"reason"`
	ServiceAccounts []string     `json:"service_accounts,omitempty"` // to reference it
	Digest          string       `json:"current_digest,omitempty"`
	// WriteRefused is the API server's refusal of a dry run of exactly this write: apply's
	// write will fail (and the root is held back).
	WriteRefused string `json:"write_refused,omitempty"`
}

// revisionOf is what an in-sync pull secret of the credential holds: the cluster credential's
// ("") or a tenant's ("" for a tenant the input does not rotate: nothing is in sync with it).
func (in Input) revisionOf(credential string) string {
	if credential == "" {
		return in.PullSecretRevision
	}

	for _, t := range in.Tenants {
		if t.Name == credential {
			return t.Revision
		}
	}

	return ""
}

// planSecrets decides every pull secret's action: consumers by namespace and name, the root
// Flux secret last. revisionOf is the digest an in-sync secret of a credential holds (SHA-256 of
// the dockerconfigjson bytes the fan-out writes).
func planSecrets(obs []SecretObs, revisionOf func(credential string) string) []SecretPlan {
	out := make([]SecretPlan, 0, len(obs))

	for _, s := range obs {
		revision := revisionOf(s.Credential)
		sp := SecretPlan{Namespace: s.Namespace, Secret: s.Name, Role: s.Role, Credential: s.Credential, Digest: s.Digest, ServiceAccounts: s.MissingFrom,
			WriteRefused: s.WriteRefused}
		where := s.Namespace + "/" + s.Name

		switch {
		case s.OutsideRoles:
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, s.OutsideRolesSentence(), nil
		case len(s.Contested) > 0:
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, s.ContestedSentence(), nil
		case s.Moved && !s.MoveDeclared:
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, s.MoveSentence(), nil
		case s.NamespaceMissing:
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, "namespace "+s.Namespace+" does not exist", nil
		case s.Foreign != "":
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, where+" is managed by "+s.Foreign+": ghcrsync leaves it alone", nil
		case s.Exists && s.Type != "kubernetes.io/dockerconfigjson":
			sp.Action, sp.Reason, sp.ServiceAccounts = SecretSkip, fmt.Sprintf("%s is of type %s, not kubernetes.io/dockerconfigjson: ghcrsync does not change a Secret's type", where, s.Type), nil
		case !s.Exists:
			sp.Action, sp.Reason = SecretCreate, where+" does not exist"
		case s.Moved && s.Digest == revision:
			sp.Action, sp.Reason = SecretUpdate, where+" already holds credential revision "+human.Short(revision)+", but the mark of "+credentialName(s.MovedFrom)
		case s.Digest != revision:
			sp.Action, sp.Reason = SecretUpdate, fmt.Sprintf("%s holds another credential (%s)", where, human.ShortOrNone(s.Digest))
		case len(s.MissingFrom) > 0:
			sp.Action, sp.Reason = SecretUpdate, "service account(s) "+strings.Join(s.MissingFrom, ", ")+" do not reference "+where+" yet"
		default:
			sp.Action, sp.Reason = SecretNoOp, where+" already holds credential revision "+human.Short(revision)
		}

		if s.Moved && sp.Action == SecretUpdate {
			sp.Reason += "; it moves from " + credentialName(s.MovedFrom) + " to " + credentialName(s.Credential) + ", as the roles in force were rendered"
		}

		if sp.Role == RoleRoot && (sp.Action == SecretCreate || sp.Action == SecretUpdate) {
			sp.Reason += "; switched last, only after every node and consumer succeeded in the run"
		}

		out = append(out, sp)
	}

	sort.SliceStable(out, func(i, j int) bool {
		if (out[i].Role == RoleRoot) != (out[j].Role == RoleRoot) {
			return out[j].Role == RoleRoot
		}

		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}

		return out[i].Secret < out[j].Secret
	})

	return out
}

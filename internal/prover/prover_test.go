package prover

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/credential"
	"github.com/ghcrsync/ghcrsync/plan"
)

// What a proof's outcome says of a credential in use: only the registry's own refusal (401,
// 403) is "refused"; anything without such an answer is "unreachable", never "valid".
func TestJudgeProof(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"proved", nil, plan.CredentialValid},
		{"401 at the token step", &credential.ProofError{Step: "token", Status: 401}, plan.CredentialRefused},
		{"403 on the manifest", fmt.Errorf("wrapped: %w", &credential.ProofError{Step: "manifest", Status: 403}), plan.CredentialRefused},
		{"404 on the manifest", &credential.ProofError{Step: "manifest", Status: 404}, plan.CredentialUnreachable},
		{"500", &credential.ProofError{Step: "token", Status: 500}, plan.CredentialUnreachable},
		{"no answer", errors.New("dial tcp: connection refused"), plan.CredentialUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeProof(tc.err); got != tc.want {
				t.Fatalf("%s, want %s", got, tc.want)
			}
		})
	}
}

package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ghcrsync/ghcrsync/internal/sandbox/secretfile"
)

// RotateSecret makes a fresh credential (user name prefixed by user) the desired one: the
// registry accepts it and secret.enc.yaml holds it. The previous desired credential becomes
// OldCredential. A campaign of rotations calls it once per rotation.
func (s *Sandbox) RotateSecret(user string) (Credential, error) {
	c := newCredential(user)
	s.registry.AddCredential(c.Username, c.Password)

	enc, err := secretfile.Encrypt(DockerConfigJSON(c), s.ageRecipient)
	if err != nil {
		return Credential{}, err
	}

	if err := os.WriteFile(filepath.Join(s.opts.Dir, SecretFile), enc, 0o600); err != nil {
		return Credential{}, err
	}

	s.credMu.Lock()
	s.oldCred, s.newCred = s.newCred, c
	s.credMu.Unlock()

	return c, nil
}

// TenantSecret makes a new credential for user valid in the registry and writes it, encrypted
// as the cluster's is, to DIR/NAME.enc.yaml: a tenant credential's SOPS file (several
// credentials in one configuration). It returns the credential and the file's name.
func (s *Sandbox) TenantSecret(name, user string) (Credential, string, error) {
	c := newCredential(user)
	s.registry.AddCredential(c.Username, c.Password)

	enc, err := secretfile.Encrypt(DockerConfigJSON(c), s.ageRecipient)
	if err != nil {
		return Credential{}, "", err
	}

	file := name + ".enc.yaml"

	return c, file, os.WriteFile(filepath.Join(s.opts.Dir, file), enc, 0o600)
}

// Reset brings the machines back to the fleet's starting shape after faults: every machine
// powered on and answering at once, the API endpoint up, the autoscaled pool at its
// configured size, every Node Ready. The autoscaler is left paused (ResumeAutoscaler). It
// does not touch what ghcrsync or a test wrote (annotations, cordons, taints, secrets).
func (s *Sandbox) Reset(ctx context.Context) error {
	s.pauseAutoscaler(true)

	for _, m := range s.fleet.Machines() {
		m.SetHung(false)
		m.SetLatency(0)
		m.PowerOn()
	}

	if err := s.fleet.endpoint.open(); err != nil {
		return fmt.Errorf("sandbox reset: API endpoint: %w", err)
	}

	for _, m := range s.fleet.Machines() {
		if err := m.waitRebooted(ctx); err != nil {
			return err
		}
	}

	autoscaled := func() []*Machine {
		var out []*Machine

		for _, m := range s.fleet.Machines() {
			if m.Autoscaled {
				out = append(out, m)
			}
		}

		return out
	}

	for ms := autoscaled(); len(ms) > s.opts.Autoscaled; ms = autoscaled() {
		m := ms[len(ms)-1]
		s.fleet.removeMachine(m)

		if err := s.Kube().CoreV1().Nodes().Delete(ctx, m.Name, deleteOpts); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("sandbox reset: delete %s: %w", m.Name, err)
		}
	}

	if s.real != nil {
		s.autoscaler.restart() // the pool is recreated from the template as it is now
	}

	for len(autoscaled()) < s.opts.Autoscaled {
		if _, err := s.autoscaler.scaleUp(ctx); err != nil {
			return fmt.Errorf("sandbox reset: scale up: %w", err)
		}
	}

	return s.WaitNodesReady(ctx, 2*time.Minute)
}

// PauseAutoscaler stops the autoscaler's loop; with clearCandidates it also takes its
// DeletionCandidate taints off, as the autoscaler does when it decides a node is needed.
func (s *Sandbox) PauseAutoscaler(ctx context.Context, clearCandidates bool) error {
	s.pauseAutoscaler(true)

	if !clearCandidates {
		return nil
	}

	nodes, err := s.autoscaler.managed(ctx)
	if err != nil {
		return err
	}

	for _, n := range nodes {
		if !hasTaint(&n, DeletionCandidateTaint) {
			continue
		}

		if err := s.autoscaler.updateNode(ctx, n.Name, func(n *corev1.Node) bool {
			n.Spec.Taints = withoutTaint(n.Spec.Taints, DeletionCandidateTaint)

			return true
		}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}

	s.autoscaler.mu.Lock()
	s.autoscaler.candidates = map[string]int{}
	s.autoscaler.mu.Unlock()

	return nil
}

// ResumeAutoscaler restarts the autoscaler's loop.
func (s *Sandbox) ResumeAutoscaler() { s.pauseAutoscaler(false) }

// pauseAutoscaler pauses (resumes) the simulation's loop, or stops (starts) the real one.
func (s *Sandbox) pauseAutoscaler(p bool) {
	if s.real != nil {
		s.real.setPaused(p)

		return
	}

	s.autoscaler.setPaused(p)
}

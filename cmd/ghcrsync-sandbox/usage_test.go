package main

import (
	"testing"

	"github.com/ghcrsync/ghcrsync/internal/usage"
)

// Every flag's help renders as written (usage.Garbled; its negative control is in its package).
func TestFlagUsagesRenderAsWritten(t *testing.T) {
	for _, p := range usage.Problems(newRoot()) {
		t.Error(p)
	}
}

// Package apply executes a saved plan: the per-node fence transaction as a state machine whose
// phases are the state file's phases, and the run's ordering and parallelism.
package apply

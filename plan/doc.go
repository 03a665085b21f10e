// Package plan is the pure planner: a function from a cluster snapshot, the configuration,
// the desired credential revision and the prior state to a plan, and the saved-plan format.
// It performs no I/O.
package plan

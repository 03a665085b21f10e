// Package state holds the state model (lineage, serial, fence records) and its backends.
package state

// Package cache computes affinity keys and places them on endpoints so that
// follow-up requests find the KV cache their predecessors left behind, and
// independent callers (every process that imports inferlb is its own router)
// agree on where each key lives without talking to each other.
//
// Keys are seeded: with a per-process random seed nobody can aim traffic at
// one backend; a fleet that wants cross-process agreement shares a secret seed.
package cache

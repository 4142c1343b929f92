// Package safeguard is the fleet safeguard: at most K nodes of a fleet
// may hold one of K slot Leases in one namespace, and a node takes
// capacity away (its taint, a GPU reset, a drain, a reboot request) only
// while it holds one, so that a fault common to many nodes cannot cordon
// the fleet. Slots is the protocol; Shared lets the taint and remediation
// hold one node's slot together. docs/fleet.md explains the design.
package safeguard

// Package kubeapi owns all of the agent's kube-apiserver traffic: one
// informer on the node's own Node object (NodeWatch) that the tainter,
// the preflight gate and the labeler read instead of polling, the taint,
// condition and Events that mirror health.Fitness (Tainter), the preflight
// taint and condition that keep pods off a node until its preflight passed
// since the host booted (NodeObject.SetPreflight), the Events other parts
// post about the node (NodeEvents: GPU process findings and kills, posted
// once each), the operator's clear-faults and preflight-rerun annotations,
// the topology labels and annotations and the move advice annotation
// (Labeler; the advice's pods read once each for their priority and
// owner, its writes spaced by MoveAdviceInterval), the remediation's API
// calls (RemediationAPI), and jittered retries. The tainter asks its
// Safeguard before adding the taint; the agent's is package safeguard's
// slot, shared with remediation and given this package's clients. It talks
// through client-go's clientset (Clients), which the DRA driver's library
// shares, and a metadata client for the safeguard's count of Nodes.
//
// At steady state it makes no requests at all besides the informer's one
// watch: periodic resyncs re-check the cached object, and every write is
// made only when the cached Node differs from what the agent wants.
package kubeapi

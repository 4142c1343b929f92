// This module stands in for github.com/mwitkow/go-conntrack in the
// agent's build (a replace directive in the root go.mod); see README.md.
module github.com/mwitkow/go-conntrack

go 1.24

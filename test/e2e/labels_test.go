package e2e

// nodeLabels are what the kubelet puts on the node at registration.
var nodeLabels = map[string]string{}

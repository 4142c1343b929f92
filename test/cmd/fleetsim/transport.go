package main

import (
	"net/http"
	"net/url"

	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

// agentConfig is one simulated agent's rest.Config: a copy of base with
// its own user agent, the agent's default rate limit, a counting
// transport and, through a Proxy func (client-go caches transports only
// for configs without one), its own TLS transport and connections.
func agentConfig(base *rest.Config, userAgent string, c *apicount.Counter) *rest.Config {
	rc := rest.CopyConfig(base)
	// The agent's defaults (QPS 5, burst 10), as it runs.
	kubeapi.ConfigureREST(rc, userAgent, kubeapi.ClientConfig{})
	rc.WrapTransport = c.Wrap
	rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return rc
}

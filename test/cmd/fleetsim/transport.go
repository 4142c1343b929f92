package main

import (
	"bytes"
	"io"
	"maps"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/rest"

	"github.com/gpu-node-agent/gpu-node-agent/kubeapi"
)

// counter counts one agent's requests by kind ("LIST leases", "PATCH
// nodes/status", "WATCH nodes", ...) and the response body bytes it
// received, watch streams apart (they stay open and carry events).
type counter struct {
	mu    sync.Mutex
	kinds map[string]int
	// kindBytes are the response body bytes by kind (watches aside).
	kindBytes map[string]*atomic.Int64
	// bytes are the non-watch response body bytes, watchBytes those of
	// watch streams.
	bytes, watchBytes atomic.Int64
	// denied counts the refused requests by "<why> <kind>" (why: policy,
	// forbidden, unauthorized); samples keeps the first refusals' bodies.
	denied  map[string]int
	samples []string
	// answers counts the other answers that were not a success, by
	// "<status code> <kind>" (a 409 is a Conflict on an update or patch,
	// or AlreadyExists on a create: a slot probe that missed).
	answers map[string]int
}

func newCounter() *counter {
	return &counter{kinds: map[string]int{}, kindBytes: map[string]*atomic.Int64{}, denied: map[string]int{}, answers: map[string]int{}}
}

// maxSamples is how many refusal bodies a counter keeps.
const maxSamples = 3

// refusal classifies a response: "policy" for a 403 from a
// ValidatingAdmissionPolicy, "forbidden" for another 403 (RBAC),
// "unauthorized" for a 401, "" otherwise. For a refusal it reads the
// (small) body, which it replaces with a copy, and returns it.
func refusal(resp *http.Response) (string, string) {
	var why string
	switch resp.StatusCode {
	case http.StatusForbidden:
		why = "forbidden"
	case http.StatusUnauthorized:
		why = "unauthorized"
	default:
		return "", ""
	}
	var body []byte
	if resp.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	if why == "forbidden" && bytes.Contains(body, []byte("ValidatingAdmissionPolicy")) {
		why = "policy"
	}
	return why, string(body)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// countingBody adds what is read to n and to kind (when not nil).
type countingBody struct {
	io.ReadCloser
	n, kind *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	b.n.Add(int64(k))
	if b.kind != nil {
		b.kind.Add(int64(k))
	}
	return k, err
}

// wrap is a rest.Config.WrapTransport.
func (c *counter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		kind := requestKind(r)
		c.mu.Lock()
		c.kinds[kind]++
		kb := c.kindBytes[kind]
		if kb == nil {
			kb = &atomic.Int64{}
			c.kindBytes[kind] = kb
		}
		c.mu.Unlock()
		resp, err := rt.RoundTrip(r)
		if err == nil {
			if why, body := refusal(resp); why != "" {
				c.mu.Lock()
				c.denied[why+" "+kind]++
				if len(c.samples) < maxSamples {
					c.samples = append(c.samples, body)
				}
				c.mu.Unlock()
			} else if resp.StatusCode >= 300 {
				c.mu.Lock()
				c.answers[strconv.Itoa(resp.StatusCode)+" "+kind]++
				c.mu.Unlock()
			}
		}
		if err == nil && resp.Body != nil {
			body := countingBody{ReadCloser: resp.Body, n: &c.bytes, kind: kb}
			if strings.HasPrefix(kind, "WATCH") {
				body = countingBody{ReadCloser: resp.Body, n: &c.watchBytes}
			}
			resp.Body = body
		}
		return resp, err
	})
}

// requestKind names a request by verb and resource: a GET of a
// collection is a LIST, ?watch=true a WATCH, a metadata-only LIST is
// marked so.
func requestKind(r *http.Request) string {
	resource, name, sub := splitPath(r.URL.Path)
	if sub != "" {
		resource += "/" + sub
	}
	verb := r.Method
	switch {
	case r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1":
		verb = "WATCH"
	case r.Method == http.MethodGet && name == "":
		verb = "LIST"
		if strings.Contains(r.Header.Get("Accept"), "PartialObjectMetadataList") {
			resource += " (metadata)"
		}
	}
	return verb + " " + resource
}

// splitPath returns the resource, object name and subresource of an API
// path (/api/v1/nodes/x/status, /apis/g/v/namespaces/ns/leases/x).
func splitPath(p string) (resource, name, sub string) {
	seg := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return p, "", ""
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	if len(seg) > 0 {
		resource = seg[0]
	}
	if len(seg) > 1 {
		name = seg[1]
	}
	if len(seg) > 2 {
		sub = seg[2]
	}
	return resource, name, sub
}

// snapshot is a copy of counts, summed over agents.
type snapshot struct {
	kinds             map[string]int
	kindBytes         map[string]int64
	bytes, watchBytes int64
	// denied are the refused requests by "<why> <kind>" (counter.denied),
	// samples some refusal bodies (in a sum, not in a difference).
	denied  map[string]int
	samples []string
	// answers are the non-success answers that were not refusals, by
	// "<status code> <kind>" (counter.answers).
	answers map[string]int
}

func (c *counter) addTo(s *snapshot) {
	c.mu.Lock()
	for k, v := range c.answers {
		s.answers[k] += v
	}
	for k, v := range c.kinds {
		s.kinds[k] += v
	}
	for k, v := range c.kindBytes {
		s.kindBytes[k] += v.Load()
	}
	for k, v := range c.denied {
		s.denied[k] += v
	}
	for _, b := range c.samples {
		if len(s.samples) < maxSamples {
			s.samples = append(s.samples, b)
		}
	}
	c.mu.Unlock()
	s.bytes += c.bytes.Load()
	s.watchBytes += c.watchBytes.Load()
}

func sum(cs []*counter) snapshot {
	s := snapshot{kinds: map[string]int{}, kindBytes: map[string]int64{}, denied: map[string]int{}, answers: map[string]int{}}
	for _, c := range cs {
		c.addTo(&s)
	}
	return s
}

// minus is s - before.
func (s snapshot) minus(before snapshot) snapshot {
	d := snapshot{kinds: maps.Clone(s.kinds), kindBytes: maps.Clone(s.kindBytes), bytes: s.bytes - before.bytes,
		watchBytes: s.watchBytes - before.watchBytes, denied: maps.Clone(s.denied), answers: maps.Clone(s.answers)}
	if d.answers == nil {
		d.answers = map[string]int{}
	}
	for k, v := range before.answers {
		d.answers[k] -= v
		if d.answers[k] == 0 {
			delete(d.answers, k)
		}
	}
	if d.kindBytes == nil {
		d.kindBytes = map[string]int64{}
	}
	if d.denied == nil {
		d.denied = map[string]int{}
	}
	for k, v := range before.denied {
		d.denied[k] -= v
		if d.denied[k] == 0 {
			delete(d.denied, k)
		}
	}
	for k, v := range before.kinds {
		d.kinds[k] -= v
		if d.kinds[k] == 0 {
			delete(d.kinds, k)
		}
	}
	for k, v := range before.kindBytes {
		d.kindBytes[k] -= v
		if d.kindBytes[k] == 0 {
			delete(d.kindBytes, k)
		}
	}
	return d
}

// requests counts the requests, watches excluded.
func (s snapshot) requests() int {
	n := 0
	for k, v := range s.kinds {
		if !strings.HasPrefix(k, "WATCH") {
			n += v
		}
	}
	return n
}

// deniedTotal counts the refused requests.
func (s snapshot) deniedTotal() int {
	n := 0
	for _, v := range s.denied {
		n += v
	}
	return n
}

// describeAnswers lists the non-success answers by status code and kind,
// most first.
func (s snapshot) describeAnswers() string {
	return snapshot{kinds: s.answers}.describe(func(string) bool { return true })
}

// describeDenied lists the refused requests by why and kind, most first.
func (s snapshot) describeDenied() string {
	return snapshot{kinds: s.denied}.describe(func(string) bool { return true })
}

func (s snapshot) prefixed(p string) int {
	n := 0
	for k, v := range s.kinds {
		if strings.HasPrefix(k, p) {
			n += v
		}
	}
	return n
}

// describeBytes lists the response bytes by kind, most first.
func (s snapshot) describeBytes() string {
	var ks []string
	for k, v := range s.kindBytes {
		if v > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return s.kindBytes[ks[i]] > s.kindBytes[ks[j]] })
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + " " + mib(s.kindBytes[k]))
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// describe lists the kinds matching keep, most frequent first.
func (s snapshot) describe(keep func(string) bool) string {
	var ks []string
	for k := range s.kinds {
		if keep(k) {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool {
		if s.kinds[ks[i]] != s.kinds[ks[j]] {
			return s.kinds[ks[i]] > s.kinds[ks[j]]
		}
		return ks[i] < ks[j]
	})
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + " " + itoa(s.kinds[k]))
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// agentConfig is one simulated agent's rest.Config: a copy of base with
// its own user agent, the agent's default rate limit, a counting
// transport and, through a Proxy func (client-go caches transports only
// for configs without one), its own TLS transport and connections.
func agentConfig(base *rest.Config, userAgent string, c *counter) *rest.Config {
	rc := rest.CopyConfig(base)
	// The agent's defaults (QPS 5, burst 10), as it runs.
	kubeapi.ConfigureREST(rc, userAgent, kubeapi.ClientConfig{})
	rc.WrapTransport = c.wrap
	rc.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	return rc
}

// Package apicount counts what clients ask of the API server and what it
// answers: a rest.Config.WrapTransport that tallies requests by kind
// ("LIST leases", "WATCH nodes"), the response bytes received (watch
// streams apart), the watch streams open, and the refusals. The fleet
// simulation and the real-apiserver tests read the same numbers.
package apicount

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Counter counts one client's requests by kind ("LIST leases", "PATCH
// nodes/status", "WATCH nodes", ...) and the response body bytes it
// received, watch streams apart (they stay open and carry events).
type Counter struct {
	mu    sync.Mutex
	kinds map[string]int
	// kindBytes are the response body bytes by kind, watch streams too.
	kindBytes map[string]*atomic.Int64
	// bytes are the non-watch response body bytes, watchBytes those of
	// watch streams (by kind in kindBytes too).
	bytes, watchBytes atomic.Int64
	// open counts the watch streams open now, by kind.
	open map[string]*atomic.Int64
	// denied counts the refused requests by "<why> <kind>" (why: policy,
	// forbidden, unauthorized); samples keeps the first refusals' bodies.
	denied  map[string]int
	samples []string
	// answers counts the other answers that were not a success, by
	// "<status code> <kind>" (a 409 is a Conflict on an update or patch,
	// or AlreadyExists on a create: a slot probe that missed).
	answers map[string]int
}

// New returns a Counter with nothing counted.
func New() *Counter {
	return &Counter{kinds: map[string]int{}, kindBytes: map[string]*atomic.Int64{}, open: map[string]*atomic.Int64{},
		denied: map[string]int{}, answers: map[string]int{}}
}

// maxSamples is how many refusal bodies a Counter keeps.
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

// watchBody is a watch stream's countingBody that counts itself open
// until closed.
type watchBody struct {
	countingBody
	open *atomic.Int64
	once sync.Once
}

func (b *watchBody) Close() error {
	b.once.Do(func() { b.open.Add(-1) })
	return b.countingBody.Close()
}

// Wrap is a rest.Config.WrapTransport.
func (c *Counter) Wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		kind := RequestKind(r)
		c.mu.Lock()
		c.kinds[kind]++
		kb := c.kindBytes[kind]
		if kb == nil {
			kb = &atomic.Int64{}
			c.kindBytes[kind] = kb
		}
		open := c.open[kind]
		if open == nil {
			open = &atomic.Int64{}
			c.open[kind] = open
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
			if strings.HasPrefix(kind, "WATCH") {
				if resp.StatusCode == http.StatusOK {
					open.Add(1)
				} else {
					open = &atomic.Int64{} // never opened: its Close counts nothing
				}
				resp.Body = &watchBody{countingBody: countingBody{ReadCloser: resp.Body, n: &c.watchBytes, kind: kb}, open: open}
			} else {
				resp.Body = countingBody{ReadCloser: resp.Body, n: &c.bytes, kind: kb}
			}
		}
		return resp, err
	})
}

// RequestKind names a request by verb and resource: a GET of a
// collection is a LIST, ?watch=true a WATCH, a metadata-only LIST is
// marked so.
func RequestKind(r *http.Request) string {
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

// Snapshot is a copy of counts, summed over clients.
type Snapshot struct {
	// Kinds counts the requests by kind, KindBytes the response bytes by
	// kind (watch streams too); Bytes are the requests' response bytes,
	// WatchBytes the watch streams'.
	Kinds             map[string]int
	KindBytes         map[string]int64
	Bytes, WatchBytes int64
	// Open are the watch streams open when the Snapshot was taken, by
	// kind (in a difference: those open at its end).
	Open map[string]int64
	// Denied are the refused requests by "<why> <kind>" (Counter.denied),
	// Samples some refusal bodies (in a sum, not in a difference).
	Denied  map[string]int
	Samples []string
	// Answers are the non-success answers that were not refusals, by
	// "<status code> <kind>" (Counter.answers).
	Answers map[string]int
}

func (c *Counter) addTo(s *Snapshot) {
	c.mu.Lock()
	for k, v := range c.answers {
		s.Answers[k] += v
	}
	for k, v := range c.kinds {
		s.Kinds[k] += v
	}
	for k, v := range c.kindBytes {
		s.KindBytes[k] += v.Load()
	}
	for k, v := range c.denied {
		s.Denied[k] += v
	}
	for k, v := range c.open {
		if n := v.Load(); n != 0 {
			s.Open[k] += n
		}
	}
	for _, b := range c.samples {
		if len(s.Samples) < maxSamples {
			s.Samples = append(s.Samples, b)
		}
	}
	c.mu.Unlock()
	s.Bytes += c.bytes.Load()
	s.WatchBytes += c.watchBytes.Load()
}

// Sum is the counts of cs added up.
func Sum(cs []*Counter) Snapshot {
	s := Snapshot{Kinds: map[string]int{}, KindBytes: map[string]int64{}, Open: map[string]int64{}, Denied: map[string]int{}, Answers: map[string]int{}}
	for _, c := range cs {
		c.addTo(&s)
	}
	return s
}

// Minus is s - before.
func (s Snapshot) Minus(before Snapshot) Snapshot {
	d := Snapshot{Kinds: maps.Clone(s.Kinds), KindBytes: maps.Clone(s.KindBytes), Bytes: s.Bytes - before.Bytes,
		WatchBytes: s.WatchBytes - before.WatchBytes, Open: s.Open, Denied: maps.Clone(s.Denied), Answers: maps.Clone(s.Answers)}
	if d.Answers == nil {
		d.Answers = map[string]int{}
	}
	for k, v := range before.Answers {
		d.Answers[k] -= v
		if d.Answers[k] == 0 {
			delete(d.Answers, k)
		}
	}
	if d.KindBytes == nil {
		d.KindBytes = map[string]int64{}
	}
	if d.Denied == nil {
		d.Denied = map[string]int{}
	}
	for k, v := range before.Denied {
		d.Denied[k] -= v
		if d.Denied[k] == 0 {
			delete(d.Denied, k)
		}
	}
	for k, v := range before.Kinds {
		d.Kinds[k] -= v
		if d.Kinds[k] == 0 {
			delete(d.Kinds, k)
		}
	}
	for k, v := range before.KindBytes {
		d.KindBytes[k] -= v
		if d.KindBytes[k] == 0 {
			delete(d.KindBytes, k)
		}
	}
	return d
}

// Requests counts the requests, watches excluded.
func (s Snapshot) Requests() int {
	n := 0
	for k, v := range s.Kinds {
		if !strings.HasPrefix(k, "WATCH") {
			n += v
		}
	}
	return n
}

// DeniedTotal counts the refused requests.
func (s Snapshot) DeniedTotal() int {
	n := 0
	for _, v := range s.Denied {
		n += v
	}
	return n
}

// DescribeAnswers lists the non-success answers by status code and kind,
// most first.
func (s Snapshot) DescribeAnswers() string {
	return Snapshot{Kinds: s.Answers}.Describe(func(string) bool { return true })
}

// DescribeDenied lists the refused requests by why and kind, most first.
func (s Snapshot) DescribeDenied() string {
	return Snapshot{Kinds: s.Denied}.Describe(func(string) bool { return true })
}

// Prefixed counts the requests of the kinds starting with p.
func (s Snapshot) Prefixed(p string) int {
	n := 0
	for k, v := range s.Kinds {
		if strings.HasPrefix(k, p) {
			n += v
		}
	}
	return n
}

// DescribeBytes lists the response bytes by kind, most first.
func (s Snapshot) DescribeBytes() string {
	var ks []string
	for k, v := range s.KindBytes {
		if v > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return s.KindBytes[ks[i]] > s.KindBytes[ks[j]] })
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + " " + MiB(s.KindBytes[k]))
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// DescribePerNode lists the response bytes by kind divided by n, most
// first, in bytes.
func (s Snapshot) DescribePerNode(n int) string {
	var ks []string
	for k, v := range s.KindBytes {
		if v > 0 {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return s.KindBytes[ks[i]] > s.KindBytes[ks[j]] })
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.0f B", k, float64(s.KindBytes[k])/float64(max(1, n)))
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// Describe lists the kinds matching keep, most frequent first.
func (s Snapshot) Describe(keep func(string) bool) string {
	var ks []string
	for k := range s.Kinds {
		if keep(k) {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool {
		if s.Kinds[ks[i]] != s.Kinds[ks[j]] {
			return s.Kinds[ks[i]] > s.Kinds[ks[j]]
		}
		return ks[i] < ks[j]
	})
	var b strings.Builder
	for i, k := range ks {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + " " + strconv.Itoa(s.Kinds[k]))
	}
	if b.Len() == 0 {
		return "-"
	}
	return b.String()
}

// Without drops the kinds starting with prefix from the request counts
// (the bytes stay).
func (s Snapshot) Without(prefix string) Snapshot {
	out := s
	out.Kinds = map[string]int{}
	for k, v := range s.Kinds {
		if !strings.HasPrefix(k, prefix) {
			out.Kinds[k] = v
		}
	}
	return out
}

// Received is every response byte, requests' and watch streams'.
func (s Snapshot) Received() int64 { return s.Bytes + s.WatchBytes }

// MiB formats b bytes in MiB.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

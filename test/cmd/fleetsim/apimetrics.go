package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/client-go/kubernetes"

	"github.com/gpu-node-agent/gpu-node-agent/test/internal/apicount"
)

var labelRE = regexp.MustCompile(`(\w+)="([^"]*)"`)

// apiserverRequests reads kube-apiserver's own apiserver_request_total
// from /metrics, summed by "VERB resource[/subresource]". A request is
// counted when it completes, so a WATCH shows only once its stream ended;
// non-resource requests (resource "", such as this scrape) are left out.
func apiserverRequests(ctx context.Context, c kubernetes.Interface) (apicount.Snapshot, error) {
	raw, err := c.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apicount.Snapshot{}, fmt.Errorf("scrape kube-apiserver /metrics: %w", err)
	}
	s := apicount.Snapshot{Kinds: map[string]int{}}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			continue
		}
		labels := map[string]string{}
		for _, m := range labelRE.FindAllStringSubmatch(line[:end], -1) {
			labels[m[1]] = m[2]
		}
		if labels["resource"] == "" {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		kind := labels["verb"] + " " + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			kind += "/" + sub
		}
		s.Kinds[kind] += int(v)
	}
	return s, sc.Err()
}

// Package docs holds no code: its test checks the repository's Markdown.
package docs

import (
	"bufio"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the repository root, seen from this package's directory.
const root = ".."

// skipDirs are build outputs and fetched binaries, relative to root; hidden
// directories are skipped too.
var skipDirs = map[string]bool{".build": true, "bin": true, "test/kubebins": true}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional "title".
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink matches a reference definition: [label]: target.
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	// codeSpan is inline code, where brackets are not links.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	// heading is an ATX heading.
	heading = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	// htmlAnchor is an explicit <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*(?:name|id)\s*=\s*"([^"]+)"`)
	// linkInHeading is a link written in a heading: its text is what the
	// slug is made of.
	linkInHeading = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	// scheme is a URL scheme: such links leave the repository.
	scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// link is one relative link found in a Markdown file.
type link struct {
	file   string // relative to root
	line   int
	target string
}

// markdownFiles lists every *.md file under root, relative to it.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || skipDirs[rel]) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// scan reads a Markdown file and returns its links and its anchors (the
// slugs of its headings, GitHub's way, and explicit HTML anchors). Fenced
// code blocks and inline code are not read for links or headings.
func scan(path, rel string) ([]link, map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var links []link
	anchors := map[string]bool{}
	slugs := map[string]int{}
	fence := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t>")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			s := slug(m[2])
			if k := slugs[s]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", s, k)] = true
			} else {
				anchors[s] = true
			}
			slugs[s]++
		}
		text := codeSpan.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			links = append(links, link{rel, n, m[1]})
		}
		if m := refLink.FindStringSubmatch(text); m != nil {
			links = append(links, link{rel, n, m[1]})
		}
	}
	return links, anchors, sc.Err()
}

// slug is GitHub's anchor for a heading: the text without Markdown link
// syntax, lower case, every character but letters, digits, spaces, - and
// _ dropped, spaces made -.
func slug(h string) string {
	h = linkInHeading.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestMarkdownLinks: every relative link of every Markdown file in the
// repository names a file that exists, and every #anchor a heading (or
// HTML anchor) of the file it points into. External links are not
// followed.
func TestMarkdownLinks(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 10 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(files), root, files)
	}
	anchors := map[string]map[string]bool{}
	var links []link
	for _, rel := range files {
		l, a, err := scan(filepath.Join(root, rel), rel)
		if err != nil {
			t.Fatal(err)
		}
		links = append(links, l...)
		anchors[rel] = a
	}
	checked := 0
	for _, l := range links {
		if scheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
			continue // http:, https:, mailto:, ...: not ours to check
		}
		checked++
		if msg := checkLink(l, anchors); msg != "" {
			t.Errorf("%s:%d: %s: %s", l.file, l.line, l.target, msg)
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the scanner is broken")
	}
}

// checkLink says what is wrong with l, or "" when nothing is. anchors are
// the anchors of every Markdown file by path; a file not among them is
// read when a link points into it.
func checkLink(l link, anchors map[string]map[string]bool) string {
	p, frag, _ := strings.Cut(l.target, "#")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	target := l.file
	if p != "" {
		if strings.HasPrefix(p, "/") {
			target = strings.TrimPrefix(p, "/")
		} else {
			target = filepath.ToSlash(filepath.Join(filepath.Dir(l.file), p))
		}
		if target == ".." || strings.HasPrefix(target, "../") {
			return "points outside the repository"
		}
		if _, err := os.Stat(filepath.Join(root, target)); err != nil {
			return "no such file"
		}
	}
	if frag == "" || !strings.HasSuffix(target, ".md") {
		return ""
	}
	a, ok := anchors[target]
	if !ok {
		var err error
		if _, a, err = scan(filepath.Join(root, target), target); err != nil {
			return err.Error()
		}
		anchors[target] = a
	}
	if !a[strings.ToLower(frag)] && !a[frag] {
		return fmt.Sprintf("%s has no heading with anchor #%s", target, frag)
	}
	return ""
}

// TestSlug pins the heading slugs to GitHub's rules.
func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"GPU sharing (time-slicing)":        "gpu-sharing-time-slicing",
		"Try it without a GPU":              "try-it-without-a-gpu",
		"`health`: the checks":              "health-the-checks",
		"What the e2e needs (1.37.2, v2.2)": "what-the-e2e-needs-1372-v22",
		"See [the chart](x.md) values":      "see-the-chart-values",
		"snake_case and dash-case":          "snake_case-and-dash-case",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

package compare

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Outcome is what became of one comparison.
type Outcome int

const (
	// Agree: both sides gave the value and they agree (within the
	// tolerance).
	Agree Outcome = iota
	// Disagree: both sides gave the value and they do not agree.
	Disagree
	// NotCompared: a side did not give the value (N/A, not answered,
	// not captured); Detail says why.
	NotCompared
)

// Finding is one comparison.
type Finding struct {
	// Subject is what was compared: "node", "gpu 3", "gpu 3 mig 1",
	// "device plugin", "dra".
	Subject string
	// What names the value ("memory.total", "ecc.volatile.corrected").
	What    string
	Outcome Outcome
	// Detail gives both sides and the tolerance, or why not compared.
	Detail string
	// Explained is the reason an --explained line gives for a
	// disagreement; empty when none matched.
	Explained string
}

// Line is the finding as printed, without its outcome.
func (f Finding) Line() string { return f.Subject + " " + f.What + ": " + f.Detail }

// Report is every comparison of one capture, in order.
type Report struct {
	Findings []Finding
}

// Counts are the summary line's numbers: comparisons made (agreeing or
// not), disagreements no explanation matched, explained disagreements, and
// values not compared.
func (r *Report) Counts() (compared, disagreements, explained, notCompared int) {
	for _, f := range r.Findings {
		switch f.Outcome {
		case Agree:
			compared++
		case Disagree:
			compared++
			if f.Explained != "" {
				explained++
			} else {
				disagreements++
			}
		case NotCompared:
			notCompared++
		}
	}
	return
}

// ExitCode is 1 when a disagreement is not explained, 0 otherwise.
func (r *Report) ExitCode() int {
	if _, d, _, _ := r.Counts(); d > 0 {
		return 1
	}
	return 0
}

// Unexplained are the disagreements no explanation matched.
func (r *Report) Unexplained() []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Outcome == Disagree && f.Explained == "" {
			out = append(out, f)
		}
	}
	return out
}

// Write prints the disagreements, one line each, then the explained ones,
// then the values not compared (one line per value and reason, naming its
// subjects), then the summary line. verbose also prints every agreement.
func (r *Report) Write(w io.Writer, verbose bool) error {
	bw := bufio.NewWriter(w)
	for _, f := range r.Findings {
		if f.Outcome == Disagree && f.Explained == "" {
			fmt.Fprintf(bw, "DISAGREE %s\n", f.Line())
		}
	}
	for _, f := range r.Findings {
		if f.Outcome == Disagree && f.Explained != "" {
			fmt.Fprintf(bw, "explained %s; explained: %s\n", f.Line(), f.Explained)
		}
	}
	type key struct{ what, why string }
	var order []key
	subjects := map[key][]string{}
	for _, f := range r.Findings {
		if f.Outcome != NotCompared {
			continue
		}
		k := key{f.What, f.Detail}
		if _, ok := subjects[k]; !ok {
			order = append(order, k)
		}
		subjects[k] = append(subjects[k], f.Subject)
	}
	for _, k := range order {
		fmt.Fprintf(bw, "not compared: %s %s: %s\n", joinSubjects(subjects[k]), k.what, k.why)
	}
	if verbose {
		for _, f := range r.Findings {
			if f.Outcome == Agree {
				fmt.Fprintf(bw, "ok %s\n", f.Line())
			}
		}
	}
	c, d, e, n := r.Counts()
	fmt.Fprintf(bw, "hw-compare: compared %d, disagreements %d, explained %d, not compared %d\n", c, d, e, n)
	return bw.Flush()
}

// joinSubjects names subjects for one line: "gpu 0-7" for a run of GPUs.
func joinSubjects(s []string) string {
	var idx []int
	for _, x := range s {
		n, ok := strings.CutPrefix(x, "gpu ")
		i, err := strconv.Atoi(n)
		if !ok || err != nil {
			return strings.Join(s, ", ")
		}
		idx = append(idx, i)
	}
	slices.Sort(idx)
	var parts []string
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", idx[i], idx[j]))
		} else {
			parts = append(parts, strconv.Itoa(idx[i]))
		}
		i = j + 1
	}
	return "gpu " + strings.Join(parts, ",")
}

// Explanation is one line of an --explained file: disagreements whose
// line (Finding.Line) Pattern matches are known, for Reason.
type Explanation struct {
	Pattern *regexp.Regexp
	Reason  string
}

// ParseExplained reads an --explained file: one explanation per line, a
// regular expression (Go syntax, no spaces: use \s) then the reason;
// blank lines and lines starting with # are skipped.
func ParseExplained(r io.Reader) ([]Explanation, error) {
	var out []Explanation
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		pat := strings.Fields(line)[0]
		reason := strings.TrimSpace(line[len(pat):])
		if reason == "" {
			return nil, fmt.Errorf("line %d: %q gives a pattern but no reason", n, line)
		}
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, Explanation{Pattern: re, Reason: reason})
	}
	return out, sc.Err()
}

// Explain marks each disagreement the first matching explanation covers.
func (r *Report) Explain(ex []Explanation) {
	for i := range r.Findings {
		f := &r.Findings[i]
		if f.Outcome != Disagree {
			continue
		}
		for _, e := range ex {
			if e.Pattern.MatchString(f.Line()) {
				f.Explained = e.Reason
				break
			}
		}
	}
}

package health

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// xidRunbooks are the alert runbooks (docs/runbooks) whose XID tables come
// from the XID table, by the class each alert's action covers
// (action.go: xidAction).
var xidRunbooks = []struct {
	file  string
	class XIDClass
}{
	{"GPUResetRequired.md", XIDClassReset},
	{"GPUNodeRebootRequired.md", XIDClassReboot},
	{"GPUNVLinkFault.md", XIDClassNVLink},
}

// xidRunbookTable is the generated table of class c's XIDs, between the
// markers a runbook holds it in.
func xidRunbookTable(c XIDClass) string {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- xid-table %s -->\n", c)
	fmt.Fprintf(&b, "Generated from `health.XIDTable()` (class `%s`) by\n", c)
	b.WriteString("`GNA_UPDATE_DOCS=1 go test -run TestXIDRunbooksUpToDate ./health/`.\n\n")
	b.WriteString("| XID | Meaning | Catalog mnemonic | Catalog bucket |\n| ---: | --- | --- | --- |\n")
	for _, e := range XIDTable() {
		if e.Class == c {
			fmt.Fprintf(&b, "| %d | %s | `%s` | %s |\n", e.XID, e.Meaning, e.Mnemonic, e.Bucket)
		}
	}
	b.WriteString("<!-- end xid-table -->")
	return b.String()
}

var xidTableBlock = regexp.MustCompile(`(?s)<!-- xid-table (\w+) -->.*?<!-- end xid-table -->`)

// TestXIDRunbooksUpToDate: the XID runbooks list exactly the XIDs of their
// class, as the XID table has them (the source for their advice).
func TestXIDRunbooksUpToDate(t *testing.T) {
	for _, rb := range xidRunbooks {
		path := filepath.Join("..", "docs", "runbooks", rb.file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks := xidTableBlock.FindAllStringSubmatch(string(b), -1)
		if len(blocks) != 1 || blocks[0][1] != string(rb.class) {
			t.Errorf("%s: want one xid-table block of class %s, found %d", path, rb.class, len(blocks))
			continue
		}
		want := xidRunbookTable(rb.class)
		if os.Getenv("GNA_UPDATE_DOCS") != "" {
			updated := strings.Replace(string(b), blocks[0][0], want, 1)
			if err := os.WriteFile(path, []byte(updated), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if blocks[0][0] != want {
			t.Errorf("%s: the XID table is stale: run GNA_UPDATE_DOCS=1 go test -run TestXIDRunbooksUpToDate ./health/", path)
		}
		if a := xidAction(rb.class); !strings.Contains(string(b), fmt.Sprintf("action=%q", a)) {
			t.Errorf("%s: the runbook of class %s does not name its action %s", path, rb.class, a)
		}
	}
}

package preflight

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable prints the report as a table, one row per result (ITEM,
// TARGET, STATUS, DETAIL), then the summary line.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tTARGET\tSTATUS\tDETAIL")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Item, r.Target, strings.ToUpper(string(r.Status)), r.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, rep.Summary(0))
	return err
}

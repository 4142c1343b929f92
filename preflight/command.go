package preflight

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gpu-node-agent/gpu-node-agent/internal/runcmd"
)

// GPUsEnv is the variable that gives the command the GPUs' UUIDs,
// comma-separated.
const GPUsEnv = "GNA_PREFLIGHT_GPUS"

// checkCommand runs command.args (no shell) with GNA_PREFLIGHT_GPUS set,
// in its own process group, and passes when it exits 0 within
// command.timeout. On the timeout (or ctx ending) the whole group is
// killed. A failure's message keeps the end of its output.
//
// wrap, when set, rewrites the program and arguments that are run (a
// simulated node's command faults); the result names the configured
// command.
func checkCommand(ctx context.Context, cfg Config, uuids []string, wrap func([]string) []string) Result {
	r := Result{Item: ItemCommand, Target: "node"}
	args := cfg.Command.Args
	if len(args) == 0 {
		r.Status, r.Detail = Skipped, "no command configured (preflight.command.args)"
		return r
	}
	run := args
	if wrap != nil {
		run = wrap(args)
	}
	res := runcmd.Run(ctx, strings.Join(args, " "), run, append(os.Environ(), GPUsEnv+"="+strings.Join(uuids, ",")),
		time.Duration(cfg.Command.Timeout), cfg.Command.OutputBytes)
	if res.Err != nil {
		r.Status, r.Detail = Fail, res.Err.Error()
	} else {
		r.Status, r.Detail = Pass, fmt.Sprintf("%s exited 0", strings.Join(args, " "))
	}
	return r
}

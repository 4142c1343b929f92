// Command workload is the e2e test pods' image: it prints its environment
// (one VAR=value per line, sorted) so tests can read the container log,
// then waits until it is terminated.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

func main() {
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		fmt.Println(kv)
	}
	fmt.Println("--- end of environment")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	<-sigs
}

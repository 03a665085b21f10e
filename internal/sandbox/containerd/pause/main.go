// Command pause is the sandbox's pod sandbox image's one binary, as registry.k8s.io/pause is:
// it holds the pod's namespaces and waits for a signal. With the argument "true" it exits 0 at
// once (a probe image's entrypoint). Built static, it runs on a real node's runc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "true" {
		return
	}

	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	<-ch
}

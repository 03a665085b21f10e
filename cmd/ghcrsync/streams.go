package main

import (
	"io"

	"google.golang.org/grpc/grpclog"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// routeLibraryOutput sends what the libraries print on their own — client-go's API warnings
// (a deprecated API, a webhook's warning text), klog, and gRPC's logger — through ghcrsync's
// guarded stderr instead of the raw file descriptor: text from the API server or Talos can
// then neither start a workflow command nor reach the terminal as a control sequence.
func routeLibraryOutput(stderr io.Writer) {
	rest.SetDefaultWarningHandler(rest.NewWarningWriter(stderr, rest.WarningWriterOptions{Deduplicate: true}))

	klog.LogToStderr(false)
	klog.SetOutput(stderr)

	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, stderr))
}

// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command images builds the operator and agent OCI images for linux/amd64 and linux/arm64 without a container
// engine (make images runs it): an OCI image layout per component (both architectures, crane push --index) and a
// tarball per component and architecture (crane push, docker load).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/hack/internal/images"
)

func main() {
	var o images.RunOptions
	flag.StringVar(&o.Root, "root", ".", "repository root")
	flag.StringVar(&o.OutDir, "out", "bin/images", "output folder")
	flag.StringVar(&o.Version, "version", "dev", "version written into the binaries and the images' labels and tags")
	flag.StringVar(&o.Registry, "registry", "ghcr.io/fabricxfer", "registry and namespace of the image names")
	arches := flag.String("arch", "amd64,arm64", "comma-separated architectures")
	epoch := flag.Int64("epoch", 0, "timestamp of every file, in seconds since 1970 (SOURCE_DATE_EPOCH)")
	flag.Parse()
	o.Arches = strings.Split(*arches, ",")
	o.Epoch = time.Unix(*epoch, 0).UTC()
	written, notes, err := images.Run(context.Background(), o)
	for _, n := range notes {
		fmt.Fprintln(os.Stderr, "images:", n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
	for _, w := range written {
		fmt.Println(w)
	}
}

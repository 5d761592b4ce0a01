// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"errors"
	"flag"

	"github.com/spf13/pflag"
)

// flagSinkKey marks a context in which a command only hands over its flags (for shell completion) instead of
// running. Each command defines its flags next to the code that reads them; this lets completion learn them
// from the same definitions instead of a copy that would drift.
type flagSinkKey struct{}

// errFlagsCollected stops a command whose flags were collected for completion.
var errFlagsCollected = errors.New("flags collected")

// withFlagSink returns a context in which parseFlags and parsePFlags add the command's flags to sink.
func withFlagSink(ctx context.Context, sink *pflag.FlagSet) context.Context {
	return context.WithValue(ctx, flagSinkKey{}, sink)
}

// parseFlags parses a command's (Go flag package) flags, or hands them to completion.
func parseFlags(ctx context.Context, fs *flag.FlagSet, args []string) error {
	if sink, ok := ctx.Value(flagSinkKey{}).(*pflag.FlagSet); ok {
		sink.AddGoFlagSet(fs)
		return errFlagsCollected
	}
	return fs.Parse(args)
}

// parsePFlags parses a command's kubectl-style (pflag) flags, or hands them to completion.
func parsePFlags(ctx context.Context, fs *pflag.FlagSet, args []string) error {
	if sink, ok := ctx.Value(flagSinkKey{}).(*pflag.FlagSet); ok {
		sink.AddFlagSet(fs)
		return errFlagsCollected
	}
	return fs.Parse(args)
}

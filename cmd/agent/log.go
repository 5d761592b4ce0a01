// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// logFlags choose how the agent logs: through slog, as JSON (one object a line, for log pipelines) or text,
// with the keys the operator's JSON logs use (ts, level, logger, msg, error).
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: json (one object a line, the operator's keys) or text")
	fs.StringVar(&l.level, "log-level", "info", "least severe level logged: debug, info, warn, error, or a verbosity number (1 is debug)")
}

// parseLevel reads debug, info, warn, error or a logr verbosity n (slog level -n).
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info", "":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn, error or a verbosity of 0 or more", s)
	}
	return slog.Level(-n), nil
}

// handler builds the slog handler writing to w.
func (l logFlags) handler(w io.Writer) (slog.Handler, error) {
	level, err := parseLevel(l.level)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: operatorKeys}
	switch l.format {
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	case "text", "":
		return slog.NewTextHandler(w, opts), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", l.format)
}

// logger is the agent's logr.Logger over the slog handler (the reporter and controller-runtime's client take
// logr; the transfer side takes the same handler as slog).
func (l logFlags) logger(w io.Writer) (logr.Logger, error) {
	h, err := l.handler(w)
	if err != nil {
		return logr.Discard(), err
	}
	log := logr.FromSlogHandler(h)
	// client-go (klog) and controller-runtime log through the same handler, so every line has one format.
	klog.SetLogger(log.WithName("client"))
	ctrllog.SetLogger(log.WithName("client"))
	return log, nil
}

// operatorKeys renames slog's built-in keys to the operator's (controller-runtime's zap JSON): ts in RFC 3339,
// a lowercase level, error for an error.
func operatorKeys(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		if t, ok := a.Value.Any().(time.Time); ok {
			return slog.String("ts", t.UTC().Format(time.RFC3339Nano))
		}
		a.Key = "ts"
	case slog.LevelKey:
		if lv, ok := a.Value.Any().(slog.Level); ok {
			return slog.String("level", levelName(lv))
		}
	case "err":
		a.Key = "error"
	}
	return a
}

// levelName is zap's name of a level: debug for logr verbosities, info, warn, error.
func levelName(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "debug"
	case l < slog.LevelWarn:
		return "info"
	case l < slog.LevelError:
		return "warn"
	}
	return "error"
}

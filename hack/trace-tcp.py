#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Timeline of staged tcp writes from the execution traces of the two agents (bench_tcp.py --trace-dir DIR):

    for t in DIR/a.trace DIR/b.trace; do go tool trace -d=parsed $t > $t.txt; done
    hack/trace-tcp.py DIR/a.trace.txt DIR/b.trace.txt

The sending agent marks each staged write's start and end and, per chunk, its gather queued and finished, its
request sent and its answer received (a read: its request sent, its answer received and its copy into the region
queued and finished); the serving agent marks each request arriving, its payload in, its GPU copy queued and
finished and its answer written (engines/tcp/marks.go; wall clock, so the agents line up). Trace reads and writes
of the same shape in separate runs: they are grouped by shape only.
For each kind of write (contiguous, or with N parts: scattered blocks) this prints the median over the writes
of when the first and the last of each step happened, in microseconds after the write started.
"""
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r'Log .*Category="tcp" Message="(\d+) (\S+) (\d+) (\d+)"')
ORDER = ["staged.gatherq", "staged.gathered", "staged.sent", "serve.request", "serve.payload", "serve.copyq",
         "serve.copied", "serve.answered", "staged.answered", "staged.copyq", "staged.copied", "staged.end"]


def read(paths):
    marks = []
    for path in paths:
        with open(path) as f:
            for line in f:
                m = LINE.search(line)
                if m:
                    marks.append((int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4))))
    marks.sort()
    return marks


def main(paths):
    marks = read(paths)
    starts = [m for m in marks if m[1] == "staged.start"]
    ends = [m for m in marks if m[1] == "staged.end"]
    kinds = defaultdict(list)  # (chunks, parts) -> [{step: (first, last, count)}]
    for s in starts:
        end = next((e for e in ends if e[0] >= s[0] and e[2:] == s[2:]), None)
        if end is None:
            continue
        steps = defaultdict(list)
        for t, step, _, _ in marks:
            if s[0] <= t <= end[0] and step in ORDER:
                steps[step].append((t - s[0]) / 1e3)
        kinds[s[2:]].append({k: (min(v), max(v), len(v)) for k, v in steps.items()})
    for (chunks, parts), runs in sorted(kinds.items()):
        print("%s, %d chunks: %d writes (median over them, us after the start; first / last of each step, count)" % (
            "contiguous" if not parts else "%d parts" % parts, chunks, len(runs)))
        for step in ORDER:
            got = [r[step] for r in runs if step in r]
            if not got:
                continue
            print("  %-16s %9.1f %9.1f  %4d" % (step, statistics.median(g[0] for g in got),
                                                statistics.median(g[1] for g in got), statistics.median(g[2] for g in got)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    main(sys.argv[1:])

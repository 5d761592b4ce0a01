#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Where a call's time goes on both sides of the fast socket: a client's own stamps (CLOCK_MONOTONIC
nanoseconds, as time.clock_gettime_ns(time.CLOCK_MONOTONIC) reads them) aligned with the phase marks of an agent
trace (agent standalone --trace=FILE; the Go runtime stamps its trace events with the same clock on Linux):

    hack/trace-align.py TRACE STAMPS.json

STAMPS.json maps a case name to a list of calls, each [call start, frame posting, reply seen, call end] (the
client's stamps around its fast connection's call(); docs/gpu-benchmarks-logs/2026-12-06T1114-h100-astamp.py
writes them). The agent marks that fall between a call's posting and its reply seen ("frame read", "decoded",
"planned", "submitted", "settled") become steps between the client's; for each step this prints the median, the
10th and the 90th percentile in microseconds.
"""
import bisect
import json
import re
import statistics
import subprocess
import sys

MARK = re.compile(r'G=(\d+) Log Time=(\d+) .*Message="([^"]+)"')


def marks(trace):
    out = subprocess.run(["go", "tool", "trace", "-d=parsed", trace], capture_output=True, text=True, check=True).stdout
    found = [(int(m.group(2)), m.group(3)) for m in map(MARK.search, out.split("\n")) if m]
    return sorted(found)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    found = marks(argv[1])
    times = [t for t, _ in found]
    for case, calls in json.load(open(argv[2])).items():
        steps = {}
        for start, posting, seen, end in calls:
            i = bisect.bisect_left(times, posting)
            between = []
            while i < len(found) and found[i][0] <= seen:
                between.append(found[i])
                i += 1
            points = ([("call start", start), ("posting", posting)] + [(m, t) for t, m in between]
                      + [("reply seen", seen), ("call end", end)])
            for (a, ta), (b, tb) in zip(points, points[1:]):
                steps.setdefault("%s -> %s" % (a, b), []).append((tb - ta) / 1e3)
        total = statistics.median((c[3] - c[0]) / 1e3 for c in calls)
        print("== %s: %d calls, p50 %.1f us" % (case, len(calls), total))
        for name, v in steps.items():
            if len(v) > len(calls) // 2:  # steps most calls went through
                v.sort()
                print("  %-34s n=%4d p50 %7.1f  p10 %7.1f  p90 %7.1f" % (
                    name, len(v), statistics.median(v), v[len(v) // 10], v[9 * len(v) // 10]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

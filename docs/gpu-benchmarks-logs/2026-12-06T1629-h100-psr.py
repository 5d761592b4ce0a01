# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Samples, every 0.1 s, the CPU each thread of the agents and Python processes last ran on and its CPU time
# (clock ticks) since the last sample; prints threads that used >= 2 ticks in the interval. argv: out file.
import os, sys, time
out = open(sys.argv[1], "w", buffering=1)
last = {}
hz = os.sysconf("SC_CLK_TCK")
me = os.getpid()
while True:
    now = time.time()
    rows = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            comm = open("/proc/%s/comm" % pid).read().strip()
            if not (comm.startswith("agent") or comm.startswith("python")):
                continue
            for tid in os.listdir("/proc/%s/task" % pid):
                s = open("/proc/%s/task/%s/stat" % (pid, tid)).read()
                f = s[s.rindex(")") + 2:].split()
                ticks = int(f[11]) + int(f[12]); cpu = int(f[36])
                d = ticks - last.get(tid, ticks)
                last[tid] = ticks
                if d >= 2:
                    rows.append("%s/%s:%s cpu%d %d" % (pid, tid, comm[:8], cpu, d))
        except (OSError, ValueError, IndexError):
            continue
    if rows:
        out.write("%.1f %s\n" % (now % 10000, "  ".join(rows)))
    time.sleep(0.1)

# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""The agent's fast connection in an execution trace: each frame's annotations (frame read, decoded, planned,
submitted, settled, replied), its system and cgo calls and the goroutines it starts, as offsets in µs from the
frame read. Reads the output of `go tool trace -d=parsed agent.trace` at /tmp/trace.txt; goroutine 31 served the
connection in that trace."""
import re, sys
lines = open('/tmp/trace.txt').read().split('\n')
evs = []
for l in lines:
    m = re.match(r'M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)', l)
    if m and m.group(3) == '31':
        evs.append((int(m.group(5)), m.group(4), m.group(6)))
def show(start_idx):
    t0 = evs[start_idx][0]
    out = []
    for t, k, rest in evs[start_idx:start_idx+40]:
        if k == 'Log':
            tag = rest.split('Message=')[1].strip('"')
        elif 'Running->Syscall' in rest: tag = 'cgo>'
        elif 'Syscall->Running' in rest: tag = '<cgo'
        elif 'NotExist->Runnable' in rest: tag = 'go-spawn'
        elif 'Running->Waiting' in rest: tag = 'park'
        elif 'Waiting->Runnable' in rest or 'Runnable->Running' in rest: tag = rest.split('GoID=')[1].split()[0] + ':' + rest.split()[-2]
        else: tag = k + ' ' + rest[:40]
        out.append("%s@%.1f" % (tag, (t - t0) / 1e3))
        if k == 'Log' and 'replied' in rest:
            break
    print(' '.join(out))
reads = [i for i, (t, k, rest) in enumerate(evs) if k == 'Log' and 'frame read' in rest]
for i in reads[150:156]:
    show(i)
print('---- submissions of the last rounds')
for i in reads[-60:-50]:
    show(i)

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Tail diagnostics of the 4 KiB round trip on any GPU, then run.sh (tests; the done-when's cases on an H200).
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new','cudacopy.test','client.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; cat /proc/cmdline; cat /sys/devices/system/clocksource/clocksource0/current_clocksource; } > $OUT/tail.txt 2>&1
mkdir -p /tmp/fxt
GODEBUG=gctrace=1 /tmp/agent-new standalone --socket-dir /tmp/fxt --pool-name kv --health-addr 127.0.0.1:9478 > $OUT/agent-gc.log 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/fxt/kv/agent.sock ]] && break; sleep 0.2; done
echo "=== tail default $(date -u +%T)" >> $OUT/tail.txt
timeout 150 python3 .gpuc/tail.py /tmp/fxt/kv/agent.sock 20000 >> $OUT/tail.txt 2>&1
echo "=== tail client on cpu 6, agent on 8-15 $(date -u +%T)" >> $OUT/tail.txt
taskset -a -p -c 8-15 $pid >/dev/null 2>&1
timeout 150 taskset -c 6 python3 .gpuc/tail.py /tmp/fxt/kv/agent.sock 20000 >> $OUT/tail.txt 2>&1
echo "=== Go client small copy $(date -u +%T)" >> $OUT/tail.txt
taskset -a -p -c 0-15 $pid >/dev/null 2>&1
(cd client && FABRICXFER_SOCKET=/tmp/fxt/kv/agent.sock timeout 120 /tmp/client.test -test.run XXX -test.bench GPUGoClientSmallCopy -test.count 3 >> $OUT/tail.txt 2>&1)
echo "=== agent gc lines: $(grep -c '^gc ' $OUT/agent-gc.log)" >> $OUT/tail.txt
kill $pid; wait $pid 2>/dev/null
SKIP_CUDACOPY=1 bash .gpuc/run.sh > /dev/null 2>&1  # the script logged as 2026-12-06T0707-h100-run.sh
cd $OUT && tar czf rest.tgz $(ls | grep -v -e '^summary.txt$' -e '^tail.txt$') && ls | grep -v -e '^summary.txt$' -e '^tail.txt$' -e '^rest.tgz$' | xargs rm -f
cat $OUT/tail.txt | head -150
cat $OUT/summary.txt

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The 4 KiB tail's suspects, one at a time: Python's switch interval, gRPC's connectivity thread, the agent's
# garbage collector and its goroutine preemption. On an H200 then the done-when's cases.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new','client.test'):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import sys,grpc,torch;print(sys.version, grpc.__version__, torch.__version__)"; } > $OUT/tail5.txt 2>&1
agent() { rm -rf /tmp/fx5; mkdir -p /tmp/fx5; env "$@" /tmp/agent-new standalone --socket-dir /tmp/fx5 --pool-name kv --health-addr 127.0.0.1:9479 >> $OUT/agent5.log 2>&1 & pid=$!; for _ in $(seq 100); do [[ -S /tmp/fx5/kv/agent.sock ]] && break; sleep 0.2; done; }
tl() { echo "=== $1 $(date -u +%T)" >> $OUT/tail5.txt; shift; env "$@" TAIL_CASES=t,torch timeout 100 python3 .gpuc/tail.py /tmp/fx5/kv/agent.sock 20000 2>&1 | grep -v -e CudaIPC -e "^spin" -e threads >> $OUT/tail5.txt; }
agent X=1
tl "default" X=1
tl "switch interval 0.5 s" TAIL_SWITCH=0.5
tl "no grpc subscription" TAIL_NOSUB=1
tl "default again" X=1
kill $pid; wait $pid 2>/dev/null
agent GOGC=off
tl "agent GOGC=off" X=1
kill $pid; wait $pid 2>/dev/null
agent GODEBUG=asyncpreemptoff=1
tl "agent asyncpreemptoff=1" X=1
kill $pid; wait $pid 2>/dev/null
agent GODEBUG=asyncpreemptoff=1 GOGC=off
tl "agent asyncpreemptoff=1 GOGC=off, client switch 0.5 no sub" TAIL_SWITCH=0.5 TAIL_NOSUB=1
kill $pid; wait $pid 2>/dev/null
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for i in 1 2 3 4 5 6; do
    echo "=== full $i $(date -u +%T)" >> $OUT/full.txt
    timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
  done
fi
grep -hE '^(===|r[01] |   gaps >1ms)' $OUT/tail5.txt
grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt 2>/dev/null | grep -v ': done'
head -3 $OUT/tail5.txt

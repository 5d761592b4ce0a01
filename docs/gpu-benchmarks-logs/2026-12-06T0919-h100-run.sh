#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On an H200: the done-when's cases (sequential and in rounds). On any GPU: the agent's context switches and the
# machine's IPIs per 4 KiB round trip, by GOMAXPROCS.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new',):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  for i in $(seq ${H200_RUNS:-4}); do
    echo "=== sequential $i $(date -u +%T)" >> $OUT/donewhen.txt
    timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
    echo "=== rounds 10 $i $(date -u +%T)" >> $OUT/donewhen.txt
    timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
  done
fi
for procs in 16 4 2; do
  rm -rf /tmp/fx7; mkdir -p /tmp/fx7
  GOMAXPROCS=$procs /tmp/agent-new standalone --socket-dir /tmp/fx7 --pool-name kv --health-addr 127.0.0.1:9480 >> $OUT/agent7.log 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx7/kv/agent.sock ]] && break; sleep 0.2; done
  echo "=== GOMAXPROCS=$procs before $(python3 .gpuc/ctx.py $pid)" >> $OUT/ctx.txt
  TAIL_CASES=t TAIL_ROUNDS=1 timeout 60 python3 .gpuc/tail.py /tmp/fx7/kv/agent.sock 40000 2>&1 | grep -E "^r0|gaps >1ms" >> $OUT/ctx.txt
  echo "=== GOMAXPROCS=$procs after $(python3 .gpuc/ctx.py $pid)" >> $OUT/ctx.txt
  TAIL_CASES=t,torch TAIL_ROUNDS=2 timeout 60 python3 .gpuc/tail.py /tmp/fx7/kv/agent.sock 20000 2>&1 | grep -E "^r[01]" >> $OUT/ctx.txt
  kill $pid; wait $pid 2>/dev/null
done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt $OUT/ctx.txt
grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/donewhen.txt 2>/dev/null | grep -v ': done'

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On an H200: the done-when's cases (run16). Elsewhere: where case a's time goes (an agent trace of the case,
# two untraced runs, the client's side with torch ids).
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .gpuc/run16.sh; fi
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
for i in 1 2; do echo "=== untraced $i" >> $OUT/a.txt; timeout 100 $B --cases a >> $OUT/a.txt 2>&1; done
echo "=== traced" >> $OUT/a.txt; timeout 100 $B --agent-arg=--trace=/tmp/a.trace --cases a >> $OUT/a.txt 2>&1
gzip -c /tmp/a.trace > $OUT/a.trace.gz; ls -la /tmp/a.trace >> $OUT/machine.txt
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
timeout 200 python3 .gpuc/ashare.py /tmp/fx/kv/agent.sock > $OUT/ashare.txt 2>&1
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -E "^(===|a 15)" $OUT/a.txt; cat $OUT/ashare.txt

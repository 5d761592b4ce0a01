#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Python client before and after ringing a parked agent ahead of writing its ids: client stamps aligned with
# agent traces (case a, ids drawn by numpy between calls, so the agent parks before each). On an H200, the
# done-when's cases first.
set -u
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf .gpuc/oldpy.tar -C /tmp/old
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
  for i in 1 2 3 4; do echo "=== full $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
  for i in 1 2; do echo "=== rounds $i $(date -u +%T)" >> $OUT/full.txt; timeout 100 $B --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1; done
  for i in 1 2 3 4 5 6; do echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 60 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
fi
for v in old new old new; do
  rm -rf /tmp/fx; mkdir -p /tmp/fx
  /tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --trace=/tmp/$v.trace > /dev/null 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
  r=client/python; [[ $v == old ]] && r=/tmp/old/client/python
  CLIENT=$r MODE=numpy timeout 100 python3 .gpuc/astamp.py /tmp/fx/kv/agent.sock /tmp/stamps-$v.json >> $OUT/machine.txt 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
done
gzip -c /tmp/old.trace > $OUT/old.trace.gz; gzip -c /tmp/new.trace > $OUT/new.trace.gz; cp /tmp/stamps-old.json /tmp/stamps-new.json $OUT/
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; if [[ -f $OUT/full.txt ]]; then grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'; fi

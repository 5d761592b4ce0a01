#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Any GPU: gap.py (the plain 64 MiB call's ids, by type, against prepared and copy_) against one standalone agent.
# On an H200 first: bench_gpu.py's done-when cases once, then agent starts of the 64 MiB cases until 90 s.
set -u
T0=$SECONDS
python3 -c "
import lzma,shutil,os,tarfile
tarfile.open('.gpuc/pyclient.tar.xz').extractall('.')
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; cat .gpuc/agent-rev; } > $OUT/machine.txt 2>&1
B="python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "=== full 1 $(date -u +%T)" >> $OUT/full.txt; timeout 45 $B --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/full.txt 2>&1
  for i in $(seq 12); do (( SECONDS - T0 > 90 )) && break; echo "=== start $i $(date -u +%T)" >> $OUT/full.txt; timeout 20 $B --cases c64,c64-prep,c64,c64-prep >> $OUT/full.txt 2>&1; done
fi
rm -rf /tmp/fx; mkdir -p /tmp/fx
/tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv > $OUT/agent.log 2>&1 & pid=$!
for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
FABRICXFER_SOCKET=/tmp/fx/kv/agent.sock timeout 90 python3 .gpuc/gap.py > $OUT/gap.txt 2>&1; echo "gap rc $?" >> $OUT/machine.txt
kill $pid; wait $pid 2>/dev/null
date -u >> $OUT/machine.txt
cat $OUT/machine.txt $OUT/gap.txt; [[ -f $OUT/full.txt ]] && grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/full.txt | grep -v ': done'

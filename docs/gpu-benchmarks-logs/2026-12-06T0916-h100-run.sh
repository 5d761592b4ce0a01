#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The done-when's cases, all of ours then all of torch's, and in ten rounds, alternated.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new',):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
n=3; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && n=${H200_RUNS:-5}
for i in $(seq $n); do
  echo "=== sequential $i $(date -u +%T)" >> $OUT/donewhen.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
  echo "=== rounds 10 $i $(date -u +%T)" >> $OUT/donewhen.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --rounds 10 --cases a,b,c64,c64-prep,c1g,c1g-prep,d >> $OUT/donewhen.txt 2>&1
done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt
grep -hE '^(===|a 15|b 64|c 64|c 1 GiB|d 4)' $OUT/donewhen.txt | grep -v ': done'

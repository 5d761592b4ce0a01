#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_mode,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
python3 -c "
import lzma,shutil,os
for v in ('agent-diag',):
    with lzma.open('.gpuc/%s.xz'%v) as f, open('/tmp/%s'%v,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s'%v,0o755)"
mkdir -p $OUT/diag; i=0
for v in plain graph pinned plain graph; do
  i=$((i+1))
  A=/tmp/agent-diag; E=""; T=""
  case $v in legacy) E="FXDIAG_STREAM=legacy";; graph) E="FXDIAG_GRAPH=1";; pinned) A=$PWD/.gpuc/pinned-agent; T="taskset -c 0-7";; esac
  env $E timeout 40 $T python3 client/python/bench/bench_gpu.py --agent $A --cases c64,c1g,d > $OUT/diag/$i-$v.txt 2>&1
done
echo "$(date -u +%T) diag restarts done" >> $OUT/machine.txt
OUT=$OUT/ab RESTARTS=0 CASES=a,b,c64,c1g,d timeout 150 hack/gpu-socket-ab.sh .gpuc/agent-old.xz client/python .gpuc/agent-new.xz client/python 1
echo "$(date -u +%T) ab rc $?" >> $OUT/machine.txt
for f in $OUT/diag/*; do echo "$(basename $f): $(grep -E '^(c 64 MiB contiguous  |c 1 GiB contiguous  |d 4 KiB round trip p50  |d 4 KiB round trip p50: p99)' $f | tr -s ' ' | tr '\n' '|')"; done > $OUT/diag-summary.txt
date -u >> $OUT/machine.txt

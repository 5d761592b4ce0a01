#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Copies in flight on main: the -pipe cases, and eight 64 MiB submissions timed one by one.
set -u
python3 -c "
import lzma,shutil,os
for n in ('agent-new',):
    with lzma.open('.gpuc/%s.xz' % n) as f, open('/tmp/%s' % n,'wb') as o: shutil.copyfileobj(f,o)
    os.chmod('/tmp/%s' % n,0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
for i in 1 2; do
  echo "=== pipe cases $i $(date -u +%T)" >> $OUT/pipe.txt
  timeout 120 python3 client/python/bench/bench_gpu.py --agent /tmp/agent-new --cases a-pipe,c64-pipe,c1g-pipe,c64 >> $OUT/pipe.txt 2>&1
  echo "=== probe $i $(date -u +%T)" >> $OUT/pipe.txt
  timeout 120 python3 .gpuc/pipeprobe.py >> $OUT/pipe.txt 2>&1  # logged as 2026-12-06T0950-pipe-probe.py
done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt; grep -vE ": done$" $OUT/pipe.txt | grep -E "^(===|a |c |fabricxfer|torch|submission|bytes)"

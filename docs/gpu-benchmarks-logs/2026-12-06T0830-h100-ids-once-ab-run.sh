#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Python client before and after it read one id object passed for both sides once, alternated three times,
# each run a fresh agent of main: the 64 MiB copy (plain and prepared) and the 4 KiB round trip.
set -u
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee $OUT/machine.txt
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
for i in 1 2 3; do
  for side in before after; do
    tree=client/python; [[ $side == before ]] && tree=.gpuc/oldclient/client/python
    echo "=== $side $i $(date -u +%T)"
    timeout 90 python3 $tree/bench/bench_gpu.py --agent /tmp/agent-new --cases c64,c64-prep,d 2>&1 | grep -E '^(c 64|d 4)' | grep -v ': done'
  done
done 2>&1 | tee $OUT/ab-ids.txt

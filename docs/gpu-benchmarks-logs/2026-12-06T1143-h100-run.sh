#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On an H200: the done-when's cases (run16). Elsewhere: a caller busy between its calls (numpy ids drawn before
# each) against the agent with its default 2 ms spin and with a 50 ms one: how much of a cold call is the agent's
# parking.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .gpuc/run16.sh; fi
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; nproc; } > $OUT/machine.txt 2>&1
for s in 2ms 50ms 2ms 50ms; do
  rm -rf /tmp/fx; mkdir -p /tmp/fx
  /tmp/agent-new standalone --socket-dir /tmp/fx --pool-name kv --fast-spin=$s --trace=/tmp/s$s.trace > /dev/null 2>&1 & pid=$!
  for _ in $(seq 100); do [[ -S /tmp/fx/kv/agent.sock ]] && break; sleep 0.2; done
  MODE=numpy timeout 100 python3 .gpuc/astamp.py /tmp/fx/kv/agent.sock /tmp/stamps-s$s.json >> $OUT/machine.txt 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
done
for s in 2ms 50ms; do gzip -c /tmp/s$s.trace > $OUT/s$s.trace.gz; cp /tmp/stamps-s$s.json $OUT/; done
date -u >> $OUT/machine.txt
cat $OUT/machine.txt

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# On an H200: run29's done-when runs (HEAD's agent and client). Elsewhere: HEAD against 42f2b98 (agent and
# client), alternated: 2 rounds of c64,c64-prep,d, then 4 starts each of c64,c64-prep.
set -u
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash .gpuc/run29.sh; fi
python3 -c "
import lzma,shutil,os
with lzma.open('.gpuc/agent-new.xz') as f, open('/tmp/agent-new','wb') as o: shutil.copyfileobj(f,o)
os.chmod('/tmp/agent-new',0o755)"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nproc; } > $OUT/machine.txt 2>&1
OUT=$OUT/ab CASES=c64,c64-prep,d RESTARTS=4 RESTART_CASES=c64,c64-prep hack/gpu-socket-ab.sh .gpuc/old/agent-old.xz .gpuc/old/client/python /tmp/agent-new client/python 2
cat $OUT/machine.txt $OUT/ab/times.txt; grep -hE '^(===|c 64|d 4)' $OUT/ab/socket.txt $OUT/ab/restarts.txt | grep -v ': done'; grep -E "^(Ran|OK|FAIL)" $OUT/ab/pytests.txt

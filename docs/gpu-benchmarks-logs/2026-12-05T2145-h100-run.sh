#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# the copier's GPU tests, then hack/gpu-socket-ab.sh: 156b5bc (old) against main (new), two rounds, and the Python GPU tests

set -u
K=$(cd "$(dirname "$0")" && pwd)
cd "$K/.."
xz -d -k -f "$K/cudacopy.test.xz"; chmod +x "$K/cudacopy.test"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
(cd engines/gpu/cudacopy && timeout 200 "$K/cudacopy.test" -test.run 'GPU' -test.v 2>&1) > "$OUT/cudacopy-gpu-tests.txt"
grep -E "^(--- FAIL|FAIL|ok|PASS)|^--- (PASS|SKIP|FAIL): TestGPU[A-Za-z]+ " "$OUT/cudacopy-gpu-tests.txt" | tail -30
CASES=a,b,c64,c1g,d hack/gpu-socket-ab.sh "$K/agent-old.xz" "$K/oldclient/client/python" "$K/agent-new.xz" client/python ${1:-2}
grep -E "^=== |^[abcd] .* (ok|FAIL)|p99" "$OUT/socket.txt"
tail -15 "$OUT/pytests.txt"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# hack/deps.sh installs the few Debian packages `make test` needs beside Go, gcc, git, make and python3, when
# they are missing: openssl and curl (the local control plane's certificates and health checks) and the Python
# client test's packages. As root it installs them with apt-get; otherwise it names them once and goes on, and
# the tests that need a missing Python package skip saying which (the local control plane cannot do without
# openssl and curl, so their absence stops here).
set -euo pipefail
PYTHON=${PYTHON:-/usr/bin/python3}

required=() optional=()
command -v openssl >/dev/null 2>&1 || required+=(openssl)
command -v curl >/dev/null 2>&1 || required+=(curl)
py() { [ -x "$PYTHON" ] && "$PYTHON" -c "$1" >/dev/null 2>&1; }
py 'import grpc, google.protobuf' || optional+=(python3-grpcio python3-protobuf)
# The Python client's package is installed into a fresh virtual environment, and its layout tests use numpy.
py 'import ensurepip, venv' || optional+=(python3-venv)
py 'import setuptools, wheel' || optional+=(python3-setuptools python3-wheel)
py 'import pip' || optional+=(python3-pip)
py 'import numpy' || optional+=(python3-numpy)
need=("${required[@]}" "${optional[@]}")
[ ${#need[@]} -gt 0 ] || exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[deps] installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi
echo "[deps] missing Debian packages: ${need[*]}" >&2
echo "[deps] install them as root: apt-get install ${need[*]}" >&2
if [ ${#required[@]} -gt 0 ]; then
  echo "[deps] ${required[*]} cannot be done without: stopping" >&2
  exit 1
fi
echo "[deps] going on: the Python client tests skip, naming the package they miss" >&2

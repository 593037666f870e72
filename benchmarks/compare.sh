#!/usr/bin/env bash
# Ours vs TF Model Garden, alternately, small and base shapes; see benchmarks/compare.py.
# Usage: benchmarks/compare.sh [--rounds N] [--shapes small,base]   (run from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" TF_CPP_MIN_LOG_LEVEL=2
uptime >&2
exec "${PYTHON:-python}" benchmarks/compare.py "$@"

#!/bin/sh
# Run the CI-sized variant of every benchmark that has one (`--ci`: small inputs,
# a few seconds, exit non-zero only on a ratio an order of magnitude off its goal).
# A benchmark opts in by accepting the "--ci" flag; the others are skipped. Every one's --help must work.
# Usage: bench/run_ci.sh [PYTHON]   (default: .venv/bin/python)
py=${1:-.venv/bin/python}
dir=$(dirname "$0")
failed=""
for b in "$dir"/bench_*.py; do
    "$py" "$b" --help >/dev/null || failed="$failed $b(--help)"
    if ! grep -q -- '"--ci"' "$b"; then
        echo "== $b: no --ci mode, skipped"
        continue
    fi
    echo "== $b --ci"
    "$py" "$b" --ci || failed="$failed $b"
done
if [ -n "$failed" ]; then
    echo "benchmarks off their goals by an order of magnitude:$failed"
    exit 1
fi

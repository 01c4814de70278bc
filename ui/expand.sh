#!/bin/sh
# Measures the expansion of #[idempotent]: expands every ui pass case (trybuild's project, after `cargo test -p idempotency-ui`) and counts
# distinct `__private::…` paths of the runtime, and the expanded bytes.
set -e
T=${TRYBUILD_TARGET:-${CARGO_TARGET_DIR:-$(dirname "$0")/../target}/tests/trybuild}
P=$T/idempotency-ui
OUT=${1:-/tmp/expanded}
mkdir -p $OUT; rm -f $OUT/*.rs
cd $P
for bin in $(grep -o 'trybuild[0-9]*' Cargo.toml | sort -u); do
  path=$(grep -A1 "name = \"$bin\"" Cargo.toml | grep -o '/work[^"]*')
  case $path in */pass/*) ;; *) continue;; esac
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR=$T cargo rustc -q --bin $bin --profile=check -- -Zunpretty=expanded > $OUT/$(basename $path) 2>/dev/null
done
cat $OUT/*.rs | grep -oE '(idempotency|idem)::__private(::[A-Za-z_][A-Za-z0-9_]*)+' | sed -E 's/^(idempotency|idem)::__private//' | sort -u > $OUT/paths.txt
echo "distinct __private paths: $(wc -l < $OUT/paths.txt)"
echo "expanded bytes: $(cat $OUT/*.rs | wc -c)"

#!/bin/sh
# Measures the expansion of #[idempotent]: expands the pass cases (tests/pass.rs, one module per
# case) and counts the distinct `__private::…` paths of the runtime, and the expanded bytes.
# Usage: ui/expand.sh [OUT_DIR] (default /tmp/expanded). In a build directory of its own
# (target/expand): proc-macro2's build script reads RUSTC_BOOTSTRAP, so in the workspace's one
# every proc-macro crate, and all that uses one, would be built again by the next `cargo test`.
set -e
OUT=${1:-/tmp/expanded}
mkdir -p "$OUT"
cd "$(dirname "$0")"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-../target}/expand" RUSTC_BOOTSTRAP=1 cargo rustc -q -p idempotency-ui --all-features --test pass --profile=check \
  -- -Zunpretty=expanded > "$OUT/pass.rs"
grep -oE '(idempotency|idem)::__private(::[A-Za-z_][A-Za-z0-9_]*)+' "$OUT/pass.rs" |
  sed -E 's/^(idempotency|idem)::__private//' | sort -u > "$OUT/paths.txt"
echo "distinct __private paths: $(wc -l < "$OUT/paths.txt")"
echo "expanded bytes: $(wc -c < "$OUT/pass.rs")"

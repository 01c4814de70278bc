#!/usr/bin/env bash
# The shapes a claim statement can take on PostgreSQL, side by side with pgbench in one run
# (BENCHMARKS.md, "The claim statement's shape"): each shape's fresh call (the claim, then the
# store's completion, two transactions) against the raw two statements, all mixed in one pgbench
# run, one client, so that all see the same machine.
#
#   DATABASE_URL=postgres://root@127.0.0.1:5432/test bash tests/benches/pg_claim_shapes.sh
#
# SECS (60), SYNC (synchronous_commit for the run: on, or off to see the statements' own cost
# without the commit's flush). One line per shape, for scripts:
#
#   pg_claim_shape shape=row sync=off latency_ratio_raw=1.05
#
# Shapes, each on its own copy of the store's table (runtime/migrations/postgres/0001_records.sql):
# `columns` (the claim until 2026-12-03 14:40 UTC: the found row as eight columns, its two times
# worked out in SQL), `row` (the found row as one whole-row column, under a UNION ALL with a row
# from the insert), `scalar` (the claim since 2026-12-03 17:00 UTC: no row when the insert won,
# else one row with the found row as a scalar subquery), `bare` (a bare insert: the floor, which
# cannot answer a repeat in the same round trip).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DATABASE_URL:?set DATABASE_URL}"
SECS="${SECS:-60}"
SYNC="${SYNC:-on}"
schema="idem_shapes_$$"
work="$(mktemp -d)"
trap 'psql -qX "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1; rm -rf "$work"' EXIT

now='(extract(epoch FROM statement_timestamp()) * 1000)::BIGINT'
answer='{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}'
rest="decode('0123456789abcdef0123456789abcdef0123456789abcdef', 'hex')"
shapes="columns row scalar bare"

{
  echo "CREATE SCHEMA $schema; SET search_path = $schema;"
  echo "CREATE TABLE d_raw (key BYTEA PRIMARY KEY, tenant TEXT NOT NULL, tool TEXT NOT NULL, created_at BIGINT NOT NULL, response TEXT);"
  cat runtime/migrations/postgres/0001_records.sql
  for s in $shapes; do
    echo "CREATE TABLE d_$s (LIKE idempotency_records INCLUDING ALL);"
  done
} >"$work/setup.sql"
psql -qX -v ON_ERROR_STOP=1 "$DATABASE_URL" -f "$work/setup.sql" >/dev/null

for s in $shapes; do
  t="$schema.d_$s"
  ins="INSERT INTO $t (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) VALUES (:r, 7, $now, 900, $now + 30000, 1, 0, $rest, 'acme', 'user-1', 'charge_card', ''::BYTEA) ON CONFLICT (ref) DO NOTHING RETURNING 1"
  case "$s" in
    columns) claim="WITH ins AS ($ins) SELECT true, NULL::BYTEA, 1, 0::SMALLINT, NULL::BYTEA, 0::BIGINT, 0::BIGINT, NULL::BIGINT, NULL::TEXT, 0::BIGINT FROM ins UNION ALL SELECT false, key_rest, generation, state, fingerprint, claimed_at, CASE WHEN state IN (0, 2) THEN lease_or_settled_at ELSE lease_or_settled_at + 1000::BIGINT * window_s END, CASE WHEN state IN (0, 2) THEN NULL ELSE lease_or_settled_at END, response, $now FROM $t WHERE ref = :r AND NOT EXISTS (SELECT 1 FROM ins);" ;;
    row) claim="WITH ins AS ($ins) SELECT NULL::$t, NULL::BIGINT FROM ins UNION ALL SELECT r, $now FROM $t r WHERE ref = :r AND NOT EXISTS (SELECT 1 FROM ins);" ;;
    scalar) claim="WITH ins AS ($ins) SELECT (SELECT r FROM $t r WHERE ref = :r), $now WHERE NOT EXISTS (SELECT 1 FROM ins);" ;;
    bare) claim="$ins;" ;;
  esac
  complete="UPDATE $t SET state = 1, response = '$answer', lease_or_settled_at = GREATEST($now, claimed_at), window_s = 900 WHERE ref = :r AND key_rest = $rest AND token = 7 AND state = 0;"
  printf '%s\n%s\n%s\n' '\set r random(-4611686018427387903, 4611686018427387903)' "$claim" "$complete" >"$work/$s.sql"
done
printf '%s\n%s\n%s\n' '\set r random(-4611686018427387903, 4611686018427387903)' \
  "INSERT INTO $schema.d_raw (key, tenant, tool, created_at) VALUES (sha256(:r::TEXT::BYTEA), 'acme', 'charge_card', $now) ON CONFLICT (key) DO NOTHING RETURNING key;" \
  "UPDATE $schema.d_raw SET response = '$answer' WHERE key = sha256(:r::TEXT::BYTEA);" >"$work/raw.sql"

# A few thousand rows in every table first, then one mixed run.
for s in raw $shapes; do
  pgbench -n -M prepared -c 2 -j 2 -t 2500 -f "$work/$s.sql" "$DATABASE_URL" >/dev/null
done
psql -qX "$DATABASE_URL" -c "VACUUM ANALYZE" >/dev/null 2>&1 || true
mix=()
for s in raw $shapes; do mix+=(-f "$work/$s.sql@1"); done
PGOPTIONS="-c synchronous_commit=$SYNC" pgbench -n -M prepared -c 1 -T "$SECS" "${mix[@]}" "$DATABASE_URL" >"$work/out" 2>/dev/null
declare -A lat
n=0
for s in raw $shapes; do
  n=$((n + 1))
  lat[$s]=$(awk -v n="$n" '/^SQL script/ {k++} k == n && /latency average/ {print $(NF - 1); exit}' "$work/out")
  echo "$s: mean latency ${lat[$s]} ms" >&2
done
for s in $shapes; do
  ratio=$(awk -v a="${lat[$s]}" -v b="${lat[raw]}" 'BEGIN {printf "%.3f", a / b}')
  echo "pg_claim_shape shape=$s sync=$SYNC latency_ratio_raw=$ratio"
done

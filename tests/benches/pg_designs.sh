#!/usr/bin/env bash
# The PostgreSQL table designs weighed for background work at size (README "How it scales",
# BENCHMARKS.md), side by side with pgbench in one run: each design's fresh call (the claim
# statement, then the completion, two transactions, as the store runs them) against the raw two
# statements, all of them mixed in one pgbench run so that all see the same machine.
#
#   DATABASE_URL=postgres://root@127.0.0.1:5432/test bash tests/benches/pg_designs.sh
#
# SECS (100: per client count, all designs mixed in one pgbench run), ROWS pre-filled per table
# (100000). One line per design and client count, for scripts (`latency_ratio_raw`: the design's
# mean call latency over the raw statements' in the same run; HOT and bytes per row after the run):
#
#   pg_design design=partial_indexes clients=32 latency_ratio_raw=1.12 hot_pct=0 bytes_per_row=273
#
# Designs: `none` (primary key only: HOT completions, no background index), `partial_indexes`
# (the previous design: `settled` and `open` on the state), `shipped` (the store's migration as
# shipped: one index on the window's length and the claim time, which completions keep),
# `window_index` (an index on the claim
# time plus the window, set at the claim and never changed, so completions stay HOT; it serves
# purge but not the reconciler), `window_index_side_table` (the same plus a side table of
# in-flight claims written by the claim's statement and deleted by the completion's).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${DATABASE_URL:?set DATABASE_URL}"
SECS="${SECS:-100}"
ROWS="${ROWS:-100000}"
schema="idem_designs_$$"
work="$(mktemp -d)"
trap 'psql -qX "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1; rm -rf "$work"' EXIT

now='(extract(epoch FROM statement_timestamp()) * 1000)::BIGINT'
answer='{"charge_id":"ch_3PqR8sT2uV4wX5yZ6a7b","amount":4200,"currency":"EUR"}'
cols='ref BIGINT NOT NULL PRIMARY KEY, token BIGINT NOT NULL, claimed_at BIGINT NOT NULL, ends_at BIGINT NOT NULL, completed_at BIGINT, generation INTEGER NOT NULL, state SMALLINT NOT NULL, key_rest BYTEA NOT NULL, tenant TEXT NOT NULL, subject TEXT NOT NULL, tool TEXT NOT NULL, fingerprint BYTEA NOT NULL, response TEXT'

{
  echo "CREATE SCHEMA $schema; SET search_path = $schema;"
  # The store's own migration: idempotency_records with its window index.
  cat runtime/migrations/postgres/0001_records.sql
  echo "ALTER TABLE idempotency_records RENAME TO d_shipped;"
  # The previous design: the same row with two partial indexes on the state.
  echo "CREATE TABLE d_partial_indexes ($cols);"
  echo "CREATE INDEX ON d_partial_indexes (ends_at) WHERE state IN (1, 3, 4);"
  echo "CREATE INDEX ON d_partial_indexes (claimed_at) WHERE state IN (0, 2);"
  echo "CREATE TABLE d_none ($cols);"
  echo "CREATE TABLE d_window_index ($cols, window_end BIGINT NOT NULL);"
  echo "CREATE INDEX ON d_window_index (window_end);"
  echo "CREATE TABLE d_window_index_side_table ($cols, window_end BIGINT NOT NULL);"
  echo "CREATE INDEX ON d_window_index_side_table (window_end);"
  echo "CREATE TABLE d_window_index_side_table_open (ref BIGINT PRIMARY KEY, claimed_at BIGINT NOT NULL);"
  echo "CREATE TABLE d_raw (key BYTEA PRIMARY KEY, tenant TEXT NOT NULL, tool TEXT NOT NULL, created_at BIGINT NOT NULL, response TEXT);"
} >"$work/setup.sql"
psql -qX -v ON_ERROR_STOP=1 "$DATABASE_URL" -f "$work/setup.sql" >/dev/null

designs="none partial_indexes shipped window_index window_index_side_table"

# pgbench scripts: \set r picks a random reference; the key's other 24 bytes derive from it.
rest='substr(sha256(:r::TEXT::BYTEA), 1, 24)'
for d in $designs; do
  t="$schema.d_$d"
  extra_col='' extra_val='' side=''
  case "$d" in
    window_index*) extra_col=', window_end' extra_val=", $now + 900000" ;;
  esac
  if [ "$d" = window_index_side_table ]; then
    side=", o AS (INSERT INTO ${t}_open SELECT :r, $now FROM ins)"
  fi
  claim="WITH ins AS (INSERT INTO $t (ref, token, claimed_at, ends_at, generation, state, key_rest, tenant, subject, tool, fingerprint$extra_col) VALUES (:r, 7, $now, $now + 30000, 1, 0, $rest, 'acme', 'user-1', 'charge_card', ''::BYTEA$extra_val) ON CONFLICT (ref) DO NOTHING RETURNING 1)$side SELECT true, NULL::BYTEA, 1, 0::SMALLINT, NULL::BYTEA, 0::BIGINT, 0::BIGINT, NULL::BIGINT, NULL::TEXT FROM ins UNION ALL SELECT false, key_rest, generation, state, fingerprint, claimed_at, ends_at, completed_at, response FROM $t WHERE ref = :r AND NOT EXISTS (SELECT 1 FROM ins);"
  complete="UPDATE $t SET state = 1, response = '$answer', completed_at = GREATEST($now, claimed_at), ends_at = GREATEST($now, claimed_at) + 900000 WHERE ref = :r AND key_rest = $rest AND token = 7 AND state = 0"
  if [ "$d" = shipped ]; then
    # The store's own row (the window's length and one time: lease end, then settlement) and
    # claim (no row when the insert won; else the row found as one column, and the statement's
    # clock).
    claim="WITH ins AS (INSERT INTO $t (ref, token, claimed_at, window_s, lease_or_settled_at, generation, state, key_rest, tenant, subject, tool, fingerprint) VALUES (:r, 7, $now, 900, $now + 30000, 1, 0, $rest, 'acme', 'user-1', 'charge_card', ''::BYTEA) ON CONFLICT (ref) DO NOTHING RETURNING 1) SELECT (SELECT r FROM $t r WHERE ref = :r), $now WHERE NOT EXISTS (SELECT 1 FROM ins);"
    complete="UPDATE $t SET state = 1, response = '$answer', lease_or_settled_at = GREATEST($now, claimed_at), window_s = 900 WHERE ref = :r AND key_rest = $rest AND token = 7 AND state = 0"
  fi
  if [ "$d" = window_index_side_table ]; then
    complete="WITH u AS ($complete RETURNING ref) DELETE FROM ${t}_open WHERE ref IN (SELECT ref FROM u);"
  else
    complete="$complete;"
  fi
  printf '%s\n%s\n%s\n' '\set r random(-4611686018427387903, 4611686018427387903)' "$claim" "$complete" >"$work/$d.sql"
done
printf '%s\n%s\n%s\n' '\set r random(-4611686018427387903, 4611686018427387903)' \
  "INSERT INTO $schema.d_raw (key, tenant, tool, created_at) VALUES (sha256(:r::TEXT::BYTEA), 'acme', 'charge_card', $now) ON CONFLICT (key) DO NOTHING RETURNING key;" \
  "UPDATE $schema.d_raw SET response = '$answer' WHERE key = sha256(:r::TEXT::BYTEA);" >"$work/raw.sql"

# Pre-fill every table through its own statements, then analyse.
fill_clients=4
for d in raw $designs; do
  pgbench -n -M prepared -c "$fill_clients" -j 2 -t $((ROWS / fill_clients)) -f "$work/$d.sql" "$DATABASE_URL" >/dev/null 2>&1
done
psql -qX "$DATABASE_URL" -c "VACUUM ANALYZE" >/dev/null 2>&1 || true
psql -qX "$DATABASE_URL" -c "SELECT pg_stat_reset()" >/dev/null

# One pgbench run per client count with every script mixed (each transaction picks one at
# random, equal weights): all designs see the same machine at the same moments, which a machine
# whose commit latency swings tenfold from one second to the next requires. pgbench reports each
# script's mean latency; the ratio to the raw script's is the figure.
declare -A lat
for c in 1 32; do
  mix=()
  for d in raw $designs; do mix+=(-f "$work/$d.sql@1"); done
  pgbench -n -M prepared -c "$c" -j 2 -T "$SECS" "${mix[@]}" "$DATABASE_URL" >"$work/out.$c" 2>/dev/null
  n=0
  for d in raw $designs; do
    n=$((n + 1))
    lat[$d,$c]=$(awk -v n="$n" '/^SQL script/ {s++} s == n && /latency average/ {print $(NF - 1); exit}' "$work/out.$c")
    echo "clients $c $d: mean latency ${lat[$d,$c]} ms" >&2
  done
done

for d in $designs; do
  hot=$(psql -qXAt "$DATABASE_URL" -c "SELECT round(100 * n_tup_hot_upd::NUMERIC / greatest(n_tup_upd, 1)) FROM pg_stat_user_tables WHERE schemaname = '$schema' AND relname = 'd_$d'")
  side_size=0
  [ "$d" = window_index_side_table ] && side_size="pg_total_relation_size('$schema.d_${d}_open')"
  bytes=$(psql -qXAt "$DATABASE_URL" -c "SELECT (pg_total_relation_size('$schema.d_$d') + $side_size) / greatest((SELECT count(*) FROM $schema.d_$d), 1)")
  for c in 1 32; do
    ratio=$(awk -v a="${lat[$d,$c]}" -v b="${lat[raw,$c]}" 'BEGIN {printf "%.2f", a / b}')
    echo "pg_design design=$d clients=$c latency_ratio_raw=$ratio hot_pct=$hot bytes_per_row=$bytes"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

#!/usr/bin/env bash
# Hostile /sql against one `elmo serve` of a source tree: the server's and its workers'
# memory (VmRSS, VmHWM from /proc; workers sampled every 20 ms) and each answer.
#   bench/sql_hostile_memory.sh TREE PORT DATASET INDEX [serve flags...]
#   ASLIM=8000000000 bench/sql_hostile_memory.sh /tmp/old 8772 DS IX   # a tree before the
#                                      # worker: an address-space cap keeps it off the machine
# Run from the repository root (its .venv's python serves any TREE).
set -u
PY=$PWD/.venv/bin/python
TREE=$1; PORT=$2; DS=$3; IX=$4; shift 4
LOG=${TMPDIR:-/tmp}/sql_hostile_$PORT
cd "$TREE"
PYTHONPATH=$PWD prlimit --as="${ASLIM:-20000000000}" "$PY" -m pipeline.cli serve "$DS" \
    --index "$IX" --port "$PORT" "$@" > "$LOG.log" 2>&1 &
SP=$!
for _ in $(seq 1 240); do curl -s "localhost:$PORT/info" > /dev/null && break; sleep 0.5; done
kids() { for t in /proc/$SP/task/*; do cat "$t/children" 2>/dev/null; done; }
st() { awk -v k="$2:" '$1==k{print int($2/1024)}' "/proc/$1/status" 2>/dev/null; }
echo "idle: server $(st $SP VmRSS) MB; worker(s) $(for k in $(kids); do st "$k" VmRSS; done)"
( while kill -0 $SP 2>/dev/null; do
    for k in $(kids); do echo "$k $(st "$k" VmHWM)"; done; sleep 0.02
  done > "$LOG.hwm" ) &
W=$!
for q in "SELECT repeat('x', 1000000) AS s FROM range(10000)" \
         "SELECT repeat('x', (SELECT 900000 + count(*) FROM tokens)::INT) AS s FROM range(10000)" \
         "SELECT string_agg(repeat('x', 100000), ',') FROM range(100000)" \
         "SELECT list(range) FROM range(200000000)" \
         "SELECT list(s) FROM (SELECT repeat('y', 999999) s FROM range(3000))" \
         "SELECT max(length(repeat(repeat('x', 1000000), 1000))) FROM range(10)"; do
  curl -s -m 120 -o "$LOG.out" -w "%{http_code} " "localhost:$PORT/sql" \
      -H 'content-type: application/json' -d "{\"query\": \"$q\"}"
  head -c 120 "$LOG.out"; echo
done
echo "after: server $(st $SP VmRSS) MB (peak $(st $SP VmHWM) MB)"
curl -s "localhost:$PORT/sql" -H 'content-type: application/json' \
    -d '{"query": "SELECT count(*) FROM tokens"}'; echo
kill -INT $SP; wait $SP; kill $W 2>/dev/null
echo "worker peaks (VmHWM MB): $(sort -k2 -n "$LOG.hwm" | awk '{m[$1]=$2} END {for (k in m) printf "%s ", m[k]}')"

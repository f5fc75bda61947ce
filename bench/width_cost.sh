#!/bin/sh
# The host cost of the output width (issue 36): `elmo embed` with default settings on
# austen.txt with the two near-free models (bench/near_free_models.py), alternated,
# each run's user+sys CPU seconds and peak RSS from /usr/bin/time -v.
#   sh bench/width_cost.sh [PAIRS] [CORPUS...]
set -eu
PY=${PY:-.venv/bin/python}
PAIRS=${1:-2}
[ $# -gt 0 ] && shift
CORPUS=${*:-../shared/corpora/austen.txt}
WORK=${WORK:-runs/width-cost}
mkdir -p "$WORK"
[ -d "$WORK/models/wide" ] || $PY bench/near_free_models.py "$WORK/models" >/dev/null
i=0
while [ $i -lt "$PAIRS" ]; do
  for m in wide narrow; do
    rm -rf "$WORK/out-$m"
    /usr/bin/time -v $PY -m pipeline.cli embed $CORPUS --out "$WORK/out-$m" \
      --model "$WORK/models/$m" --no-progress >"$WORK/log-$m" 2>"$WORK/time-$m" || {
      echo "elmo embed ($m) failed:" >&2; grep -v '^	' "$WORK/time-$m" | tail -3 >&2; exit 1; }
    user=$(sed -n 's/.*User time (seconds): //p' "$WORK/time-$m")
    sys=$(sed -n 's/.*System time (seconds): //p' "$WORK/time-$m")
    rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/time-$m")
    bytes=$(du -sb "$WORK/out-$m/tokens" | cut -f1)
    echo "$m user=$user sys=$sys cpu=$(echo "$user + $sys" | bc) rss_mb=$((rss / 1024)) token_bytes=$bytes"
  done
  i=$((i + 1))
done

#!/usr/bin/env bash
# Everything that needs a GPU, for a GPU machine lent for minutes: one call each.
#
#   bash bench/gpu_checks.sh stages               # issue 36: model only vs end to end
#   bash bench/gpu_checks.sh checks               # kernels, training, benchmarks, pipeline
#   bash bench/gpu_checks.sh fused                # the fused-kernel checks alone
#   bash bench/gpu_checks.sh train STEPS MINUTES  # the default model's CUDA training run
#       (INIT_FROM: the model it continues, default models/default; TRAIN_SETTINGS: --set)
#
# Run from the repository root with the GPU machine's own python3 (torch and triton there;
# the project is not installed, PYTHONPATH points at the checkout). The training corpus is
# the recipe's output (`python -m elmo_model.corpus build`), carried as
# .gpu/corpus.tar.xz (`tar -C CORPUS_OUT -cf - train heldout | xz > .gpu/corpus.tar.xz`).
# Each step has its own time limit and log, so one failing step does not stop the
# others; a summary line per step goes to stdout, everything to $OUT/checks.log.
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
LOG=$OUT/checks.log
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export PY=${PY:-python3} DEV=${DEV:-cuda}  # DEV=cpu: a dry run of the plumbing
# Python packages the project needs and the GPU machine's image lacks, carried as wheels
# (`pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .gpu/whl`).
# Ray's wheel is over a call's 64 MiB, so it travels unpacked, pruned (no Java, RLlib, Tune,
# Train, Serve, Data or dashboard pages) and xz'd: .gpu/ray312.tar.xz (28 MB), made by
# `unzip ray-*-cp312-*.whl; rm -rf ray/{jars,rllib,tune,train,llm,serve,data,dashboard/client/build}`.
SITE=${SITE:-/tmp/site}
if ls .gpu/whl/*.whl >/dev/null 2>&1 && [ ! -e $SITE/jsonschema ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target $SITE .gpu/whl/*.whl
fi
if [ -f .gpu/ray312.tar.xz ] && [ ! -e $SITE/ray ]; then
    mkdir -p $SITE && xz -T0 -dc .gpu/ray312.tar.xz | tar -C $SITE -xf -
fi
[ -d $SITE ] && export PYTHONPATH=$PWD:$SITE${EXTRA_PATH:+:$EXTRA_PATH}
# The default model's training mix: the recipe's sources, the classics counted twice.
export CORPUS=/tmp/corpus-mix
export TRAIN_SETTINGS=${TRAIN_SETTINGS:-"--set precision=bfloat16 --set batch_size=256
    --set lr=0.002 --set dropout=0.1 --set seed=3"}
export INIT_FROM=${INIT_FROM:-models/default}

step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)" | tee -a "$LOG"
    local began=$SECONDS
    # through bash, so that the functions below (exported) can be timed out too
    timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "=== $name: rc $rc in $((SECONDS - began)) s" | tee -a "$LOG"
    return 0
}

unpack_corpus() {
    [ -d $CORPUS ] && return
    mkdir -p /tmp/corpus-out $CORPUS/train $CORPUS/heldout
    xz -dc .gpu/corpus.tar.xz | tar -C /tmp/corpus-out -xf -
    ln -s /tmp/corpus-out/train/*.jsonl $CORPUS/train/
    ln -s /tmp/corpus-out/train/classics.jsonl $CORPUS/train/classics-again.jsonl
    ln -s /tmp/corpus-out/heldout/*.jsonl $CORPUS/heldout/
}

elmo() { $PY -c "import sys; from pipeline.cli import main; sys.exit(main(sys.argv[1:]))" "$@"; }

standard_model() {  # random weights in the paper's shape (speed and bytes, not fidelity)
    $PY - "$1" <<'EOF'
import json, os, sys
import torch
from elmo_model import BiLM, save_model_dir
from elmo_model.training.config import resolve_config
torch.manual_seed(0)
config, _ = resolve_config(os.environ.get("MODEL_CONFIG", "standard"))
folder = save_model_dir(BiLM(config).eval(), sys.argv[1])
options = json.loads((folder / "options.json").read_text())
options.pop("training", None)
(folder / "options.json").write_text(json.dumps(options, indent=2))
print("standard model:", sum(p.numel() for p in BiLM(config).parameters()), "parameters")
EOF
}

train_probe() {  # 10 steps, then resumed to 60: checkpoint and resume on CUDA, step rate
    # shellcheck disable=SC2086
    $PY - "$CORPUS" $TRAIN_SETTINGS <<'EOF'
import os, sys, time
from elmo_model.cli import key_values
from elmo_model.training import train
corpus, settings = sys.argv[1], sys.argv[2:]
overrides = key_values(settings[1::2], "--set", "lr=0.002")
common = dict(init_from=os.environ["INIT_FROM"], device=os.environ["DEV"], progress=False, eval_lines=300,
              overrides=overrides, checkpoint_minutes=100)
began = time.perf_counter()
first = train(f"{corpus}/*/*.jsonl", "/tmp/probe", max_steps=10, **common)
load_and_ten = time.perf_counter() - began
began = time.perf_counter()
second = train(f"{corpus}/*/*.jsonl", "/tmp/probe", max_steps=60, **common)
rate = 50 / (second.state.wall_seconds - first.state.wall_seconds)
step_tokens = second.state.tokens_seen // second.state.step  # batch_size x unroll_steps
print(f"RESULT train probe: {rate:.2f} steps/s of {step_tokens} tokens "
      f"({rate * step_tokens:,.0f} tokens/s per direction); first call {load_and_ten:.0f} s, "
      f"resumed call {time.perf_counter() - began:.0f} s; steps {first.state.step} -> "
      f"{second.state.step}; held-out perplexity {second.last_perplexity['mean']:.1f}")
EOF
}

export -f elmo standard_model train_probe

case "${1:-checks}" in
stages)  # issue 36 item 6: >= 2M tokens of real text (.gpu/corpus3.txt.xz: austen, moby_dick
    # and shakespeare from ../shared/corpora, 2,135,993 tokens), standard config, bf16, int8
    : >"$LOG"
    step environment 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv; nproc; free -g | head -2; $PY -c 'import torch, triton, pyarrow, numpy, ray; \
        print(torch.__version__, triton.__version__, pyarrow.__version__, numpy.__version__, \
        ray.__version__, torch.cuda.get_device_name())'"
    xz -T0 -dc .gpu/corpus3.txt.xz | head -c "${CORPUS_BYTES:-100000000}" >/tmp/corpus3.txt
    step standard-model 60 standard_model /tmp/standard
    step gpu-stages "${STAGES_LIMIT:-560}" $PY bench/gpu_stages.py --corpus /tmp/corpus3.txt \
        --model /tmp/standard --device "$DEV" --compute-dtype bfloat16 --keep /tmp/ds-stages \
        ${STAGES_RUNS+--runs "$STAGES_RUNS"} ${STAGES_ARGS:-}
    [ -d /tmp/ds-stages ] && step dataset-verify 60 elmo dataset verify /tmp/ds-stages
    grep -E "^\||^RESULT|^model only|rror" "$LOG" | tail -n 40
    exit 0
    ;;
checks)
    : >"$LOG"
    step environment 30 bash -c "nvidia-smi --query-gpu=name,memory.total,driver_version \
        --format=csv; $PY -c 'import torch, triton, pyarrow, numpy; print(torch.__version__, \
        triton.__version__, pyarrow.__version__, numpy.__version__, torch.cuda.get_device_name())'"
    step fused-lstm-on-cuda 180 $PY tests/model/test_fused_lstm.py tests/fixtures/elmo cuda
    step train-device-test 120 $PY -m pytest -q -p no:cacheprovider tests/model/test_train.py \
        -k "device_is_checked or resumes or checkpoint"
    unpack_corpus
    step train-probe 180 train_probe
    step standard-model 60 standard_model /tmp/standard
    head -n "${WIKI_LINES:-4000}" /tmp/corpus-out/train/wikipedia.jsonl >/tmp/wiki.jsonl
    rm -rf /tmp/ds-std  # a rerun on the same warm machine writes a fresh dataset
    step pipeline-standard-bf16 120 elmo embed /tmp/wiki.jsonl --out /tmp/ds-std \
        --model /tmp/standard --tokenizer elmo-store-sentences --executor local \
        --device "$DEV" --compute-dtype bfloat16 --dtype int8
    step dataset-verify 60 elmo dataset verify /tmp/ds-std
    # last: it prints each row as it is measured, so a cut-off run still reports
    [ "$DEV" = cpu ] || step bilm-throughput 200 $PY bench/bilm_throughput.py --device "$DEV" \
        --batches 2
    ;;
fused)  # the kernel checks alone
    : >"$LOG"
    step fused-lstm-on-cuda 180 $PY tests/model/test_fused_lstm.py tests/fixtures/elmo cuda
    ;;
train)  # STEPS MINUTES: continue the bundled model; the packaged model lands in $OUT/model
    : >"$LOG"
    unpack_corpus
    step train "$(awk "BEGIN {print int(${3:?minutes} * 60 + 90)}")" elmo train "$CORPUS/*/*.jsonl" \
        --init-from "$INIT_FROM" --out /tmp/v5 --device "$DEV" --max-steps "${2:?steps}" \
        --max-minutes "$3" --checkpoint-minutes 1 --eval-lines 300 --no-progress \
        $TRAIN_SETTINGS
    grep -E "perplexity|stopped|corpus" "$LOG"
    step package 120 elmo model package /tmp/v5 --out "$OUT/model"
    cp /tmp/v5/training_state.json "$OUT/" 2>/dev/null
    ;;
*)
    echo "usage: bash bench/gpu_checks.sh checks | fused | train STEPS MINUTES" >&2
    exit 2
    ;;
esac
# the figures and failures, last: the call's reply shows the end of its output
grep -E "^RESULT|^\| (float|bfloat)|^(CUDA|device) |tokens/s|^check_|Error|rror:" "$LOG" | grep -v "^{" | tail -n 80

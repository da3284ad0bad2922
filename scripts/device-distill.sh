#!/usr/bin/env bash
# Runs on the lent H200 (what it carries: see scripts/device-prepare.sh; the teacher's first part
# and the token cache must already be in /root/stage from the call before):
#   scripts/device-distill.sh SECONDS MIXER...
# Assembles the teacher, times each stage with a short calibration run, then distils each MIXER
# with the token budget that fits SECONDS (three stages, the paper's split), then times the
# PyTorch training step of the same model in the same call. Results go to $OUT as JSON lines.
set -uo pipefail
SECONDS_BUDGET=$1; shift
source scripts/device-common.sh
device_vulkan
device_teacher /root/stage/tok
B=.bin/linearize
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
# Calibration: two steps of each stage (the second one timed).
$B distill --mixer $1 --out /root/calib --tokens $((6 * 4096)) --split 1,1,1 --checkpoint-every 1000 --heldout-tokens 512 --json > $OUT/calib.jsonl 2> $OUT/calib.err
BUDGET=$(python3 - "$OUT/calib.jsonl" "$SECONDS_BUDGET" <<'PY'
import json, sys
tps = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "step" and e["step"] > 1:
        tps[e["stage"]] = e["tokens_per_s"]
split = {1: 0.026, 2: 0.053, 3: 0.921}
# Leave 60 s for loading, the perplexities and the saves.
print(int((float(sys.argv[2]) - 60) / sum(split[s] / v for s, v in tps.items())))
PY
)
echo "budget $BUDGET tokens per run" > $OUT/budget.txt
for MIXER in "$@"; do
  /usr/bin/time -f "%e s" -o $OUT/time-$MIXER.txt $B distill --mixer $MIXER --out /root/run-$MIXER --tokens $BUDGET --checkpoint-every 100000 --json > $OUT/distill-$MIXER.jsonl 2> $OUT/distill-$MIXER.err
done
$B convert --from "$G" --to /root/hf > /dev/null
python3 scripts/bench_torch_train.py /root/hf > $OUT/torch-train.jsonl 2> $OUT/torch-train.err
cat $OUT/budget.txt $OUT/time-*.txt $OUT/torch-train.jsonl

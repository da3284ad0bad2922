#!/usr/bin/env bash
# Runs on the lent H200 (what it carries: see scripts/device-prepare.sh; the teacher's first part
# must already be in /root/stage from the call before):
#   scripts/device-distill.sh MIXER SECONDS
# Assembles the teacher, times each stage with a short calibration run, then distils MIXER with
# the token budget that fits SECONDS (three stages, the paper's split), then times the PyTorch
# training step of the same model in the same call. Results go to $OUT as JSON lines.
set -uo pipefail
MIXER=$1; SECONDS_BUDGET=$2
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LINEARIZE_HOME=/root/lh
mkdir -p $LINEARIZE_HOME/teacher $LINEARIZE_HOME/corpus /root/stage
G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$G" ]; then
  [ -f .stage/gguf.part01 ] || { echo "no teacher on this machine and no part to assemble it"; exit 2; }
  cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
fi
sha256sum "$G" | tee $OUT/teacher.sha256
for f in /root/stage/tok/*.gz; do [ -f "$f" ] && gunzip -c "$f" > $LINEARIZE_HOME/corpus/.$(basename "$f" .gz); done
B=.bin/linearize
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
# Calibration: three steps of each stage.
$B distill --mixer $MIXER --out /root/calib-$MIXER --tokens $((9 * 4096)) --split 1,1,1 --checkpoint-every 1000 --heldout-tokens 512 --json > $OUT/calib-$MIXER.jsonl 2> $OUT/calib-$MIXER.err
BUDGET=$(python3 - "$OUT/calib-$MIXER.jsonl" "$SECONDS_BUDGET" <<'PY'
import json, sys, statistics
tps = {}
for l in open(sys.argv[1]):
    e = json.loads(l)
    if e["event"] == "step" and e["step"] > 1:
        tps.setdefault(e["stage"], []).append(e["tokens_per_s"])
split = {1: 0.026, 2: 0.053, 3: 0.921}
# Per budget token: seconds of each stage; leave 90 s for evaluations and saves.
per_token = sum(split[s] / statistics.median(v) for s, v in tps.items())
print(int((float(sys.argv[2]) - 90) / per_token))
PY
)
echo "budget $BUDGET tokens" | tee $OUT/budget-$MIXER.txt
$B distill --mixer $MIXER --out /root/run-$MIXER --tokens $BUDGET --checkpoint-every 100000 --json > $OUT/distill-$MIXER.jsonl 2> $OUT/distill-$MIXER.err
echo "distill exit $?" >> $OUT/budget-$MIXER.txt
if [ ! -d /root/hf ]; then $B convert --from "$G" --to /root/hf > /dev/null; fi
python3 scripts/bench_torch_train.py /root/hf > $OUT/torch-train.jsonl 2> $OUT/torch-train.err
tail -c 2000 $OUT/distill-$MIXER.err

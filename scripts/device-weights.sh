#!/usr/bin/env bash
# The teacher with f32 and with packed f16 weights on the lent GPU (BENCHMARKS.md, "Packed f16
# weights"). Usage: scripts/device-weights.sh [bench|eval]
#   bench: speed and memory beside PyTorch fp32 and fp16 in the same call;
#   eval:  the zero-shot tasks on the full sets with each (request files from /root/stage/eval,
#          carried by the call before, and .stage/eval).
# Expects the teacher at /root/stage/teacher.gguf (see ../shared/DEVICE.md for the two-call
# upload), .bin/linearize and the Vulkan loader set up; writes JSON to $OUT.
set -uo pipefail
T=/root/stage/teacher.gguf
export LINEARIZE_HOME=/root/lh
mkdir -p "$LINEARIZE_HOME/teacher" && ln -sf "$T" "$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ "${1:-bench}" = eval ]; then
  mkdir -p "$LINEARIZE_HOME/eval"
  for d in /root/stage/eval .stage/eval; do [ -d $d ] && cp -rn $d/. "$LINEARIZE_HOME/eval/"; done
  for w in f32 f16; do
    s=$(date +%s)
    .bin/linearize eval --weights "$w" --json > "$OUT/eval-$w.json" 2>> "$OUT/log.txt"
    echo "eval $w: $(( $(date +%s) - s )) s" | tee -a "$OUT/log.txt"
  done
  cat "$OUT"/eval-*.json | cut -c1-400
  exit 0
fi
for w in f32 f16; do
  .bin/linearize generate --weights "$w" --max-new-tokens 6 --json >> "$OUT/generate.jsonl" 2>> "$OUT/log.txt"
  .bin/linearize bench teacher --weights "$w" --json --iters 5 --prefill 8x512,4x2048 --decode 512,4096 > "$OUT/ours-$w.json" 2>> "$OUT/log.txt"
done
.bin/linearize convert --from "$T" --to /root/hf > /dev/null
python3 scripts/bench_torch_teacher.py /root/hf --prefill 8x512,4x2048 --decode 512,4096 --dtypes fp32,fp16 > "$OUT/torch.jsonl" 2>> "$OUT/log.txt"
tail -5 "$OUT/log.txt"
grep -h tokens_per_second "$OUT"/ours-*.json | head; grep -h -o '"what": "torch_[a-z]*".*' "$OUT/torch.jsonl" | cut -c1-160

#!/usr/bin/env bash
# The teacher with f32 and with packed f16 weights on the lent GPU, beside PyTorch fp32 and fp16
# in the same call (BENCHMARKS.md, "Packed f16 weights"). Expects the teacher at
# /root/stage/teacher.gguf (see ../shared/DEVICE.md for the two-call upload), .bin/linearize and
# the Vulkan loader set up; writes JSON to $OUT.
set -uo pipefail
T=/root/stage/teacher.gguf
export LINEARIZE_HOME=/root/lh
mkdir -p "$LINEARIZE_HOME/teacher" && ln -sf "$T" "$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf"
for w in f32 f16; do
  .bin/linearize generate --weights "$w" --max-new-tokens 6 --json >> "$OUT/generate.jsonl" 2>> "$OUT/log.txt"
  .bin/linearize bench teacher --weights "$w" --json --iters 5 --prefill 8x512,4x2048 --decode 512,4096 > "$OUT/ours-$w.json" 2>> "$OUT/log.txt"
done
.bin/linearize convert --from "$T" --to /root/hf > /dev/null
python3 scripts/bench_torch_teacher.py /root/hf --prefill 8x512,4x2048 --decode 512,4096 --dtypes fp32,fp16 > "$OUT/torch.jsonl" 2>> "$OUT/log.txt"
tail -5 "$OUT/log.txt"
grep -h tokens_per_second "$OUT"/ours-*.json | head; grep -h -o '"what": "torch_[a-z]*".*' "$OUT/torch.jsonl" | cut -c1-160

#!/usr/bin/env bash
# Stage 3 (end-to-end CE + KL) of one student on the lent GPU with the binary before the change
# and after it, alternating, then a profiled run of each (LINEARIZE_PROFILE=1: seconds per kernel);
# the device's peak memory of every run goes to $OUT/memory.jsonl.
# Two calls, as ../shared/DEVICE.md's upload (what a call may carry is 64 MiB):
#   1. carry .stage/gguf.part00 .stage/tok .stage/before.gz; command
#      `mkdir -p /root/stage && cp -r .stage/gguf.part00 .stage/tok .stage/before.gz /root/stage/`
#   2. carry .stage/gguf.part01 .bin .gl; command `bash scripts/device-stage3.sh [MIXER] [TOKENS]`
# (.stage/before.gz: the stripped binary before the change, gzipped; $AFTER: the binary after,
# .bin/linearize unless set.) Results go to $OUT (more than the 8 files a call returns: tar them).
set -uo pipefail
MIXER=${1:-gated_deltanet}
TOKENS=${2:-32768}
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LINEARIZE_HOME=/root/lh
mkdir -p $LINEARIZE_HOME/teacher $LINEARIZE_HOME/corpus
G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
sha256sum "$G" | tee $OUT/teacher.sha256
for f in /root/stage/tok/*.gz; do gunzip -c "$f" > $LINEARIZE_HOME/corpus/.$(basename "$f" .gz); done
gunzip -c /root/stage/before.gz > /root/before && chmod +x /root/before
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
run() { # BINARY TAG [env]
  # The device's memory in use, sampled twice a second while the run lasts: its peak in MiB.
  ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done ) > "/root/mem-$2.txt" &
  local sampler=$!
  env ${3:-} "$1" distill --mixer "$MIXER" --out "/root/run-$2" --tokens "$TOKENS" --split 0,0,1 --checkpoint-every 100000 --heldout-tokens 512 --json > "$OUT/$2.jsonl" 2> "$OUT/$2.err"
  kill $sampler 2> /dev/null
  echo "{\"run\":\"$2\",\"peak_mib\":$(sort -n "/root/mem-$2.txt" | tail -1)}" | tee -a "$OUT/memory.jsonl"
  rm -rf "/root/run-$2"
  grep '"step"' "$OUT/$2.jsonl" | tail -1 | cut -c1-300
}
for round in 1 2; do
  run /root/before "before-$round"
  run "${AFTER:-.bin/linearize}" "after-$round"
done
run /root/before profile-before LINEARIZE_PROFILE=1
run "${AFTER:-.bin/linearize}" profile-after LINEARIZE_PROFILE=1
tail -40 "$OUT/profile-after.err"

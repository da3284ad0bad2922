#!/usr/bin/env bash
# Prefill attention on tensor cores (native/attention_coop.wgsl) on the lent H200, in two calls
# back to back (the teacher's two-part upload of ../shared/DEVICE.md):
#   1. `bash scripts/device-attention.sh ops`: carry .gl .exp/run (after.xz: the binary;
#      coop.xz: the tests/coop.rs binary) .stage/gguf.part00. tests/coop.rs (the attention against
#      f64 with the GEMMs and the recurrence), then `linearize bench ops` (the attention at
#      B=8 T=512 and B=4 T=2048 on the f32 kernel and on tensor cores); stages part00.
#   2. `bash scripts/device-attention.sh teacher`: carry .gl .stage/gguf.part01 .stage/eval5.
#      The teacher's prefill in f32 and mixed, PyTorch fp32/fp16 on the same weights, and its
#      zero-shot scores on five tasks in both precisions (the mixed path must stay within 0.1
#      points of f32).
#   `bash scripts/device-attention.sh upload` (carry .stage/gguf.part00) then
#   `bash scripts/device-attention.sh peer` (carry .gl .exp/run .bin .stage/gguf.part01): the
#      teacher's prefill in mixed precision with the binary before (.bin/linearize.xz) and after
#      (.exp/run/after.xz), alternating, two rounds, and PyTorch fp32 and fp16 in the same call.
# Results go to $OUT/res.tgz.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LINEARIZE_HOME=/root/lh
B=/root/linearize
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2" && chmod +x "$2"; }
[ -f .exp/run/after.xz ] && unxz .exp/run/after.xz $B
R=/root/res && mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
teacher_file() {
  mkdir -p $LINEARIZE_HOME/teacher
  G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$G" ] || cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
  sha256sum "$G" | tee $R/teacher.sha256
}
case "$1" in
upload)
  mkdir -p /root/stage && cp .stage/gguf.part00 /root/stage/
  ;;
peer)
  teacher_file
  unxz .bin/linearize.xz /root/before
  for round in 1 2; do
    for v in before linearize; do
      timeout 60 /root/$v bench teacher --precision mixed --prefill 8x512,4x2048 --decode "" --iters 5 --json > $R/prefill-$v-$round.json 2>> $R/prefill.err
      echo "$v round $round: $(grep -o '"tokens_per_second":[0-9.]*' $R/prefill-$v-$round.json | tr '\n' ' ')"
    done
  done
  $B convert --from "$G" --to /root/hf > /dev/null 2>> $R/convert.err
  timeout 200 python3 scripts/bench_torch_teacher.py /root/hf --prefill 8x512,4x2048 --decode "" --dtypes fp32,fp16 > $R/torch-teacher.jsonl 2>> $R/torch.err
  grep prefill $R/torch-teacher.jsonl | cut -c1-200
  ;;
ops)
  mkdir -p /root/stage && cp .stage/gguf.part00 /root/stage/
  unxz .exp/run/coop.xz /root/coop
  timeout 200 /root/coop --nocapture > $R/coop-test.txt 2>&1; echo "coop tests rc=$?" >> $R/coop-test.txt
  grep -E "attention|test result|rc=" $R/coop-test.txt | tail -12
  timeout 240 $B bench ops --json --iters 10 > $R/ops.json 2> $R/ops.err
  grep -h attention $R/ops.err | cut -c1-220
  ;;
teacher)
  mkdir -p $LINEARIZE_HOME/eval
  tar xf .stage/eval5/requests5.tar -C $LINEARIZE_HOME/eval
  teacher_file
  for p in f32 mixed; do
    timeout 60 $B bench teacher --precision $p --prefill 8x512,4x2048 --decode "" --iters 5 --json > $R/teacher-$p.json 2>> $R/teacher.err
    grep -ho '"batch":[0-9]*,"seq":[0-9]*[^}]*tokens_per_second":[0-9.]*' $R/teacher-$p.json | cut -c1-200
  done
  $B convert --from "$G" --to /root/hf > /dev/null 2>> $R/convert.err
  timeout 150 python3 scripts/bench_torch_teacher.py /root/hf --prefill 8x512,4x2048 --decode "" --dtypes fp32,fp16 > $R/torch-teacher.jsonl 2>> $R/torch.err
  grep prefill $R/torch-teacher.jsonl | cut -c1-200
  for p in f32 mixed; do
    timeout 150 $B eval --precision $p --tasks lambada,winogrande,arc_easy,arc_challenge,piqa --limit 500 --json > $R/eval-$p.json 2> $R/eval-$p.err
    grep -o '"average":[0-9.]*' $R/eval-$p.json
  done
  ;;
esac
tar czf $OUT/res.tgz -C $R .

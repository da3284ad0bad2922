#!/usr/bin/env bash
# f32 against mixed precision (tensor cores) on the lent GPU, in two calls back to back (the
# teacher's two-part upload of ../shared/DEVICE.md):
#   1. `bash scripts/device-precision.sh gemm`: carry .stage/gguf.part00 .stage/tok .gl and
#      .exp/run/after.gz (the stripped binary, gzipped). Stages part00 and the token cache in
#      /root/stage, runs `linearize bench ops` (every GEMM on both paths, with its error against
#      f64) and PyTorch's cuBLAS GEMMs (scripts/bench_torch_gemm.py).
#   2. `bash scripts/device-precision.sh distill [TOKENS]`: carry .stage/gguf.part01 .gl .exp/run
#      (with coop.gz, the tests/coop.rs binary: run first, in either call).
#      The teacher's prefill in f32 and mixed, then one gated DeltaNet distillation (all three
#      stages) in each precision on the same tokens: losses, held-out perplexities, tokens/s.
#   `bash scripts/device-precision.sh stage3` (as 2): stage 3 alone in f32 and mixed, and a
#      profiled mixed run.
#   `bash scripts/device-precision.sh upload-eval` (carry .stage/gguf.part00 .stage/eval .gl; the
#      six tasks' request files in $LINEARIZE_HOME/eval's layout), then
#      `bash scripts/device-precision.sh eval [LIMIT]` (as 2): the teacher's zero-shot scores in
#      f32 and in mixed precision on the same documents.
#   `bash scripts/device-precision.sh decode` (as 2): batch-1 greedy decode of the teacher and a
#      gated DeltaNet student after long contexts, and HF generate beside them.
#   `bash scripts/device-precision.sh stage3-peer` (as 2, and carry .whl): stage 3 beside
#      scripts/bench_torch_student.py in one call.
# Results go to $OUT/res.tgz.
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LINEARIZE_HOME=/root/lh
B=/root/linearize
[ -x $B ] || [ ! -f .exp/run/after.gz ] || { gunzip -c .exp/run/after.gz > $B && chmod +x $B; }
R=/root/res && mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
if [ -f .exp/run/coop.gz ]; then  # the tests/coop.rs binary, in whichever call carries it
  gunzip -c .exp/run/coop.gz > /root/coop && chmod +x /root/coop
  /root/coop --nocapture > $R/coop-test.txt 2>&1; echo "coop tests rc=$?" >> $R/coop-test.txt
  grep -v "^ *$" $R/coop-test.txt | tail -4
fi
# The teacher from the two uploaded parts (checked), and the corpus's token cache.
teacher() {
  mkdir -p $LINEARIZE_HOME/teacher
  G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$G" ] || cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
  sha256sum "$G" | tee $R/teacher.sha256
}
corpus() {
  mkdir -p $LINEARIZE_HOME/corpus
  for f in /root/stage/tok/*.gz; do gunzip -c "$f" > $LINEARIZE_HOME/corpus/.$(basename "$f" .gz); done
}
case "${1:-gemm}" in
gemm)
  mkdir -p /root/stage && cp -r .stage/gguf.part00 .stage/tok /root/stage/
  timeout 240 $B bench ops --json --iters 10 > $R/ops.json 2> $R/ops.err
  grep -h '"path"' $R/ops.err | grep linear | cut -c1-200
  timeout 150 python3 scripts/bench_torch_gemm.py --out $R/torch-gemm.jsonl > /dev/null 2>> $R/torch.err
  ;;
distill)
  TOKENS=${2:-524288}
  teacher; corpus
  for p in f32 mixed; do
    timeout 60 $B bench teacher --precision $p --prefill 8x512,4x2048 --decode 512 --decode-tokens 16 --iters 5 --json > $R/teacher-$p.json 2>> $R/teacher.err
  done
  for p in f32 mixed; do
    timeout 200 $B distill --mixer gated_deltanet --precision $p --tokens $TOKENS --out /root/run-$p --checkpoint-every 100000 --json > $R/distill-$p.jsonl 2> $R/distill-$p.err
    grep '"perplexity"' $R/distill-$p.jsonl | tail -2 | cut -c1-200
  done
  ;;
upload-eval)
  mkdir -p /root/stage $LINEARIZE_HOME && cp .stage/gguf.part00 /root/stage/ && cp -r .stage/eval $LINEARIZE_HOME/
  ls -R $LINEARIZE_HOME/eval | head -5
  ;;
eval)
  teacher
  for p in f32 mixed; do
    timeout 200 $B eval --precision $p --limit ${2:-1000} --json > $R/eval-$p.json 2> $R/eval-$p.err
    grep -o '"average":[0-9.]*' $R/eval-$p.json
  done
  ;;
stage3)
  # Stage 3 alone, 16 steps of 8×512 in each precision, then a profiled mixed run (seconds per
  # kernel): where the step's time goes once the GEMMs run on tensor cores.
  teacher; corpus
  for p in f32 mixed; do
    timeout 120 $B distill --mixer gated_deltanet --precision $p --tokens 65536 --split 0,0,1 --heldout-tokens 512 --out /root/s3-$p --checkpoint-every 100000 --json > $R/stage3-$p.jsonl 2> $R/stage3-$p.err
    grep '"step"' $R/stage3-$p.jsonl | tail -1 | cut -c1-250
  done
  LINEARIZE_PROFILE=1 timeout 150 $B distill --mixer gated_deltanet --precision mixed --tokens 32768 --split 0,0,1 --heldout-tokens 512 --out /root/s3-prof --checkpoint-every 100000 --json > $R/stage3-profile-mixed.jsonl 2> $R/stage3-profile-mixed.err
  tail -25 $R/stage3-profile-mixed.err
  ;;
decode)
  # Batch-1 greedy decode (picks kept on the GPU, read back in bursts) after 512 and 32,768
  # tokens: the teacher and an untrained gated DeltaNet student (speed only), then HF generate
  # on the same teacher in the same call.
  teacher
  $B convert --from "$G" --to /root/hf > /dev/null 2>> $R/convert.err
  $B student --teacher smollm2-135m --mixer gated_deltanet --out /root/gdn > /dev/null 2>> $R/student.err
  timeout 120 $B bench teacher --prefill "" --decode 512,4096 --decode-tokens 64 --iters 1 --json > $R/decode-teacher.json 2>> $R/decode.err
  timeout 120 $B bench teacher --model /root/gdn --prefill "" --decode 512,32768 --decode-tokens 64 --iters 1 --json > $R/decode-gdn.json 2>> $R/decode.err
  grep -ho '"context":[0-9]*,"new_tokens":[0-9]*,"seconds":[0-9.]*,"tokens_per_second":[0-9.]*' $R/decode-*.json
  timeout 200 python3 scripts/bench_torch_teacher.py /root/hf --prefill "" --decode 512 --dtypes fp32,bf16 > $R/decode-hf.jsonl 2>> $R/decode-hf.err
  grep decode $R/decode-hf.jsonl | cut -c1-200
  ;;
stage3-peer)
  # Stage 3 of a gated DeltaNet student, ours in mixed precision, beside the same step in
  # PyTorch + fla (scripts/bench_torch_student.py; carry .whl with fla's wheels).
  teacher; corpus
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $B convert --from "$G" --to /root/hf > /dev/null 2>> $R/convert.err
  timeout 120 $B distill --mixer gated_deltanet --precision mixed --tokens 65536 --split 0,0,1 --heldout-tokens 512 --out /root/s3-mixed --checkpoint-every 100000 --json > $R/stage3-mixed.jsonl 2> $R/stage3-mixed.err
  grep '"step"' $R/stage3-mixed.jsonl | tail -1 | cut -c1-250
  PYTHONUNBUFFERED=1 timeout 330 python3 scripts/bench_torch_student.py /root/hf --override-hopper-check > $R/stage3-peer.jsonl 2> $R/stage3-peer.err
  cut -c1-250 $R/stage3-peer.jsonl; tail -3 $R/stage3-peer.err
  ;;
*)
  echo "unknown phase '$1' (gemm, distill, stage3, upload-eval, eval, decode, stage3-peer)" >&2
  exit 2
  ;;
esac
tar czf $OUT/res.tgz -C $R .

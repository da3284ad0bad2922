#!/usr/bin/env bash
# Batch-1 decode on the lent H200 (issue 14 item 5). .exp/dec holds before.xz and after.xz (the
# binaries); the teacher travels in three parts (`split -b 34M -d GGUF .stage/p3.`) so that each
# call stays under 64 MiB:
#   1. `bash scripts/device-decode.sh upload`, carrying .gl .exp/dec .stage/p3.00: unpacks the
#      binaries, stages p3.00 (`ops` also runs the after binary's `bench ops`: decode's products
#      on both GPU kernels, fused and not, the dispatch floor);
#   2. `bash scripts/device-decode.sh upload`, carrying .stage/p3.01: stages it;
#   3. `bash scripts/device-decode.sh teacher`, carrying .gl .stage/p3.02: the teacher's greedy
#      decode after 512 tokens with both binaries, alternating (f32 and f16 weights), the same
#      prompt's continuation from each (must be equal), host and kernel profiles of the after
#      binary, HF generate on the same weights; then a gated DeltaNet student (untrained: its
#      speed, not its quality) decoding after 512 and 32,768 tokens.
# The calls must follow each other within the machine's warm time. Results go to $OUT/res.tgz.
# `teacher` also runs .exp/dec/tests.xz first where a call carried it (a test binary, e.g.
# target/release/deps/ops-*: the checks that need this GPU's compiler, such as equal bits), and
# skips HF generate with PEER=0; WEIGHTS (default "f32 f16") lists the --weights to time (gguf too).
set -uo pipefail
source scripts/device-common.sh
device_vulkan
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2" && chmod +x "$2"; }
# VERSIONS: the binaries to compare (default "before after"; each .exp/dec/NAME.xz).
V=${VERSIONS:-before after}
for v in $V tests; do [ -f /root/$v ] || [ ! -f .exp/dec/$v.xz ] || unxz .exp/dec/$v.xz /root/$v; done
R=/root/res && mkdir -p $R
save() { tar czf $OUT/res.tgz -C $R .; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
case "$1" in
upload)
  mkdir -p /root/stage && cp .stage/p3.0* /root/stage/
  ;;
ops)
  mkdir -p /root/stage && cp .stage/p3.0* /root/stage/
  timeout 400 /root/after bench ops --json --iters 10 > $R/ops.json 2> $R/ops.err
  grep -hE "decode|dispatch|pos0" $R/ops.err | cut -c1-160
  ;;
teacher)
  export LINEARIZE_HOME=/root/lh && mkdir -p /root/lh/teacher && G=/root/lh/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f $G ] || cat /root/stage/p3.00 /root/stage/p3.01 .stage/p3.02 > $G
  sha256sum $G > $R/teacher.sha256
  if [ -x /root/tests ]; then
    timeout 150 /root/tests --nocapture > $R/tests.txt 2>&1; echo "tests rc=$?" >> $R/tests.txt
    grep -E "^test |test result|rc=|panicked" $R/tests.txt | head -30
  fi
  for round in 1 2; do
    for v in $V; do
      for wt in ${WEIGHTS:-f32 f16}; do
        timeout 90 /root/$v bench teacher --precision mixed --weights $wt --prefill "" --decode 512 --decode-tokens 128 --iters 1 --json > $R/decode-$v-$wt-$round.json 2>> $R/decode.err
        echo "$v $wt round $round: $(grep -o '"[a-z_]*tokens_per_second":[0-9.]*' $R/decode-$v-$wt-$round.json | tr '\n' ' ')"
      done
    done
  done
  save
  P="The history of the printing press begins"
  for v in before after; do
    timeout 60 /root/$v generate --prompt "$P" --max-new-tokens 96 --json > $R/generate-$v.json 2>> $R/generate.err
  done
  python3 -c "import json,sys; a,b=(json.load(open(f))['ids'] for f in sys.argv[1:]); print('generate:', 'same continuation' if a==b else 'DIFFERENT continuations', len(a), 'tokens')" $R/generate-before.json $R/generate-after.json
  LINEARIZE_PROFILE=host timeout 90 /root/after bench teacher --precision mixed --prefill "" --decode 512 --decode-tokens 128 --iters 1 > $R/profile-host.txt 2>&1
  LINEARIZE_PROFILE=1 timeout 90 /root/after bench teacher --precision mixed --prefill "" --decode 512 --decode-tokens 128 --iters 1 > $R/profile-kernels.txt 2>&1
  grep -E "profile" $R/profile-host.txt | head -12
  grep -E "profile" $R/profile-kernels.txt | head -16
  save
  [ "${PEER:-1}" = 0 ] || /root/after convert --from "$G" --to /root/hf > /dev/null 2>> $R/convert.err
  [ "${PEER:-1}" = 0 ] || timeout 120 python3 scripts/bench_torch_teacher.py /root/hf --prefill "" --decode 512 --decode-tokens 64 --dtypes fp32,fp16 > $R/torch-decode.jsonl 2>> $R/torch.err
  [ "${PEER:-1}" = 0 ] || grep decode $R/torch-decode.jsonl | cut -c1-200
  save
  /root/after student --mixer gated_deltanet --out /root/student > $R/student.txt 2>&1
  for v in before after; do
    timeout 60 /root/$v generate --model /root/student --prompt "$P" --max-new-tokens 64 --json > $R/student-generate-$v.json 2>> $R/generate.err
  done
  python3 -c "import json,sys; a,b=(json.load(open(f))['ids'] for f in sys.argv[1:]); print('student generate:', 'same continuation' if a==b else 'DIFFERENT continuations', len(a), 'tokens')" $R/student-generate-before.json $R/student-generate-after.json
  for v in $V; do
    timeout 120 /root/$v bench teacher --model /root/student --precision mixed --prefill "" --decode 512,32768 --decode-tokens 128 --iters 1 --json > $R/student-decode-$v.json 2>> $R/student-decode.err
    echo "student $v: $(grep -o '"context":[0-9]*\|"[a-z_]*tokens_per_second":[0-9.]*' $R/student-decode-$v.json | tr '\n' ' ')"
  done
  LINEARIZE_PROFILE=1 timeout 90 /root/after bench teacher --model /root/student --precision mixed --prefill "" --decode 512 --decode-tokens 128 --iters 1 > $R/student-profile-kernels.txt 2>&1
  grep -E "profile" $R/student-profile-kernels.txt | head -20
  ;;
esac
save

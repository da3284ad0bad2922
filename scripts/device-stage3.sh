#!/usr/bin/env bash
# Stage 3 (end-to-end CE + KL) of one student on the lent GPU with the binary before the change
# and after it, alternating, then a profiled run of each (LINEARIZE_PROFILE=1: seconds per kernel);
# the device's peak memory of every run goes to $OUT/memory.jsonl. Optionally, in the same call:
# tests/coop.rs first (its binary at .exp/run/coop.xz or .gz), and the PyTorch + fla peer last
# (scripts/bench_torch_student.py, with fla installed in /root/site by an upload call).
# A call carries at most 64 MiB with the checkout (about 11 MB on disk), so the teacher's GGUF
# (97 MB: .stage/ga and .stage/gb, its two halves) goes up in two upload calls, back to back so
# the machine stays warm:
#   1. carry .stage/ga .stage/tokx (the tokens, xz); `bash scripts/device-stage3.sh upload`
#   2. carry .stage/gb .whl (fla's wheels);           `bash scripts/device-stage3.sh upload`
#   3. carry .stage/before.xz .exp/run (after.xz, coop.xz) .gl;
#      `[ROUNDS=… PROFILE=… PEER_SECONDS=…] bash scripts/device-stage3.sh [MIXER] [TOKENS]`
# (upload takes whatever of .stage/ga, .stage/gb, .stage/tokx, .stage/gguf.part0?, .stage/tok
# and .whl the call carries.) With the checkout at ~12 MB a 48 MB half and the tokens no longer
# fit one call (session 67): split the GGUF in three (`split -b 34M -d GGUF .stage/gguf.part`),
# upload part00 with .stage/tokx, then part01, and carry part02 in the run's call (the run
# joins the parts 00.. it finds, carried or uploaded, in order).
# AFTER_ENVS="LINEARIZE_X=a LINEARIZE_X=b": the binary after once per setting in each round;
# PROFILE entries after:VAR=value profile it with one.
# `OPS=1 bash scripts/device-stage3.sh ops` (carry .stage/before.xz .gl .exp/run): tests/coop.rs
# and `bench ops` of both binaries alone, in one call without the teacher.
# (The binary before the change: .stage/before.xz or .gz, stripped; the binary after:
# .exp/run/after.xz or .gz, else $AFTER, else .bin/linearize. ROUNDS: before/after pairs, 2.
# OPS=1: `bench ops` of the binaries in OPS_BINARIES ("before after") first. PROFILE: which
# binaries to profile, "before after" (LINEARIZE_PROFILE=1; host-before, host-after:
# LINEARIZE_PROFILE=host; " " for none). TEACHER=1: prefill and batch-1 decode of the teacher,
# both binaries in mixed precision, beside scripts/bench_torch_teacher.py in fp16 and bf16,
# before the peer.)
# Results go to $OUT/res.tgz (more than the 8 files a call returns).
set -uo pipefail
if [ "${1:-}" = upload ]; then
  mkdir -p /root/stage/tok
  for part in 00:ga 01:gb; do
    for f in .stage/${part#*:} .stage/gguf.part${part%%:*}; do [ -f "$f" ] && cp "$f" /root/stage/gguf.part${part%%:*}; done
  done
  # A GGUF split in more parts (`split -b 34M -d`: a 48 MB part with the token cache and the
  # checkout passes the 64 MiB a call carries): the later ones too.
  for f in .stage/gguf.part0[2-9]; do [ -f "$f" ] && cp "$f" /root/stage/; done
  [ -d .stage/tok ] && cp .stage/tok/* /root/stage/tok/
  if [ -d .stage/tokx ]; then for f in .stage/tokx/*.xz; do xz -dc "$f" | gzip -1 > /root/stage/tok/$(basename "$f" .xz).gz; done; fi
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl
  ls -la /root/stage /root/stage/tok /root/site 2>&1 | head -20; exit 0
fi
MIXER=${1:-gated_deltanet}
TOKENS=${2:-32768}
R=/root/res && mkdir -p $R
OUT_DIR=$OUT
OUT=$R
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LINEARIZE_HOME=/root/lh
# A carried binary, xz or gzip, unpacked to $2.
unpack() { if [ -f "$1.xz" ]; then xz -dc "$1.xz" > "$2"; elif [ -f "$1.gz" ]; then gunzip -c "$1.gz" > "$2"; else return 1; fi && chmod +x "$2"; }
unpack .stage/before /root/before || echo "no .stage/before.xz or .gz: the runs of 'before' fail"
AFTER=${AFTER:-.bin/linearize}
unpack .exp/run/after /root/after && AFTER=/root/after
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
if unpack .exp/run/coop /root/coop; then
  timeout 120 /root/coop --nocapture > $OUT/coop-test.txt 2>&1; echo "coop tests rc=$?" >> $OUT/coop-test.txt
  grep -E "test result|rc=|FAILED|panicked" $OUT/coop-test.txt | head -5
fi
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
if [ "${OPS:-0}" = 1 ]; then
  for tag in ${OPS_BINARIES:-before after}; do
    bin=/root/before; [ $tag = after ] && bin=$AFTER
    timeout 150 $bin bench ops --json --iters 10 > $OUT/ops-$tag.json 2> $OUT/ops-$tag.err
    grep -h '"path":"tensor' $OUT/ops-$tag.err | cut -c1-160 | head -16
  done
  tar czf $OUT_DIR/res.tgz -C $R .
fi
# `ops` as the mixer: the tests and GEMMs only, in one call that carries no teacher.
[ "$MIXER" = ops ] && { tar czf $OUT_DIR/res.tgz -C $R .; exit 0; }
mkdir -p $LINEARIZE_HOME/teacher $LINEARIZE_HOME/corpus
G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
# The parts in order, each from the upload calls or carried in this one (the last, say).
parts() { for i in 00 01 02 03 04 05 06 07 08 09; do
  if [ -f .stage/gguf.part$i ]; then echo .stage/gguf.part$i; elif [ -f /root/stage/gguf.part$i ]; then echo /root/stage/gguf.part$i; fi
done; }
[ -f "$G" ] || cat $(parts) > "$G"
sha256sum "$G" | tee $OUT/teacher.sha256
for f in /root/stage/tok/*.gz; do gunzip -c "$f" > $LINEARIZE_HOME/corpus/.$(basename "$f" .gz); done
for round in $(seq 1 ${ROUNDS:-2}); do
  run /root/before "before-$round"
  if [ -n "${AFTER_ENVS:-}" ]; then
    # The binary after once per setting (VAR=value, space-separated), tagged by the value.
    for e in $AFTER_ENVS; do run "$AFTER" "after-${e#*=}-$round" "$e"; done
  else
    run "$AFTER" "after-$round"
  fi
  tar czf $OUT_DIR/res.tgz -C $R .
done
for tag in ${PROFILE:-before after}; do
  # host-before, host-after: LINEARIZE_PROFILE=host (the host's recording and submitting);
  # after:VAR=value, the binary after with that setting.
  mode=1; which=${tag%%:*}; extra=""
  case $tag in *:*) extra=${tag#*:}; tag="$which-${extra#*=}";; esac
  case $which in host-*) mode=host; which=${which#host-};; esac
  bin=/root/before; [ $which = after ] && bin=$AFTER
  run $bin profile-$tag "LINEARIZE_PROFILE=$mode $extra"
  grep "^profile" "$OUT/profile-$tag.err" | head -12
done
tar czf $OUT_DIR/res.tgz -C $R .
# The teacher in HF's layout, for the PyTorch peers.
hf() { [ -d /root/hf ] || "$AFTER" convert --from "$G" --to /root/hf > /dev/null 2>> $OUT/convert.err; }
if [ "${TEACHER:-0}" = 1 ]; then
  for tag in before after; do
    bin=/root/before; [ $tag = after ] && bin=$AFTER
    timeout 90 $bin bench teacher --precision mixed --prefill 8x512,4x2048 --decode 512 --decode-tokens 64 --iters 5 --json > $OUT/teacher-$tag.json 2> $OUT/teacher-$tag.err
    grep -ho '"what":"teacher_[a-z]*"[^}]*' $OUT/teacher-$tag.json | cut -c1-160
  done
  hf
  timeout 150 python3 scripts/bench_torch_teacher.py /root/hf --prefill 8x512,4x2048 --decode 512 --dtypes fp16,bf16 > $OUT/teacher-torch.jsonl 2> $OUT/teacher-torch.err
  grep -v '"env"' $OUT/teacher-torch.jsonl | cut -c1-200
  tar czf $OUT_DIR/res.tgz -C $R .
fi
if [ -d /root/site ]; then
  # The same step in PyTorch + fla (bf16 and fp32).
  hf
  PYTHONPATH=/root/site PYTHONUNBUFFERED=1 timeout ${PEER_SECONDS:-300} python3 scripts/bench_torch_student.py /root/hf --override-hopper-check > $OUT/stage3-peer.jsonl 2> $OUT/stage3-peer.err
  cut -c1-250 $OUT/stage3-peer.jsonl; tail -3 $OUT/stage3-peer.err
fi
tar czf $OUT_DIR/res.tgz -C $R .

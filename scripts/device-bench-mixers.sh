#!/usr/bin/env bash
# Mixers on the lent GPU (BENCHMARKS.md, "Mixers after the restructuring"). Usage:
#   scripts/device-bench-mixers.sh students  # every mixer's full student: prefill 8x512 with the
#                                            # binary before ($BEFORE, default .before/linearize)
#                                            # and after (.bin/linearize) the change, alternating
#   scripts/device-bench-mixers.sh peers     # `bench mixers` beside fla's chunked kernels
#   scripts/device-bench-mixers.sh kernels   # `bench mixers` before ($BEFORE) and after (with
#                                            # --backward), twice, then fla's forward
#   scripts/device-bench-mixers.sh fla-backward  # fla's forward+backward ($FLA_MIXERS)
#   scripts/device-bench-mixers.sh coop      # tests/coop.rs (.exp/run/coop.gz), then `bench
#                                            # mixers --backward` in f32 and mixed precision
#                                            # (into bench.jsonl, a line per run)
#                                            # (the recurrence's tensor-core kernels) at
#                                            # $SHAPES, twice each, alternating, a profiled
#                                            # run of each, and fla's forward+backward and
#                                            # forward of $FLA_MIXERS; fla from .whl
#   scripts/device-bench-mixers.sh variants  # for each binary .exp/run/$V.gz (V in $VARIANTS,
#                                            # default "after v2") with its test binary
#                                            # .exp/run/coop$N.gz: tests/coop.rs, then `bench
#                                            # mixers --backward` timed in $PRECISIONS and
#                                            # profiled in $PROFILE_PRECISIONS at $SHAPES
#                                            # (kernel variants side by side)
#   scripts/device-bench-mixers.sh pair      # binaries before and after a change side by side (see pair)
#   scripts/device-bench-mixers.sh parts     # a kernel's parts, one dropped at a time (see parts)
#   scripts/device-bench-mixers.sh shaders   # one binary over shader variant folders (see shaders)
#   scripts/device-bench-mixers.sh backward  # `bench mixers --backward` before ($BEFORE) and
#                                            # after, twice, a profiled run, then fla's
#                                            # forward+backward of every mixer it has
# Expects the Vulkan loader set up, the binaries, and for `students` the teacher at
# /root/stage/teacher.gguf (../shared/DEVICE.md: the two-call upload); fla's wheels installed
# for `peers`. Writes JSON lines to $OUT.
set -uo pipefail
T=/root/stage/teacher.gguf
export LINEARIZE_HOME=/root/lh
mkdir -p "$LINEARIZE_HOME/teacher" && ln -sf "$T" "$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf"
case "${1:-students}" in
students)
  for m in $(.bin/linearize student --help | sed -n 's/.*possible values: \(.*\)\]/\1/p' | tr -d ','); do
    .bin/linearize student --mixer "$m" --force --out "/root/s-$m" > /dev/null 2>> "$OUT/log.txt" || continue
    for round in 1 2; do
      for bin in "${BEFORE:-.before/linearize}" .bin/linearize; do
        [ -x "$bin" ] || continue
        r=$("$bin" bench teacher --model "/root/s-$m" --json --iters 5 --prefill 8x512 --decode 512 --decode-tokens 32 2>> "$OUT/log.txt" | tr -d '\n ')
        [ -n "$r" ] || continue  # a mixer the binary before does not know
        echo "{\"mixer\":\"$m\",\"binary\":\"$bin\",\"round\":$round,\"result\":$r}" | tee -a "$OUT/students.jsonl" | cut -c1-300
      done
    done
  done
  ;;
peers)
  .bin/linearize bench mixers --json --iters 10 > "$OUT/ours.json" 2>> "$OUT/log.txt"
  python3 scripts/bench_fla_mixers.py --shapes 8x512x9x64,4x4096x16x128 --mixers retnet,mamba2,gated_deltanet --budget 420 --out "$OUT/fla.jsonl" 2>> "$OUT/log.txt"
  grep -o '"mixer": *"[a-z_0-9]*"\|"fwd_seconds": *[0-9.e-]*' "$OUT/ours.json" | paste - - | head -20
  ;;
kernels)
  for round in 1 2; do
    "${BEFORE:-.before/linearize}" bench mixers --json --iters 10 > "$OUT/before-$round.json" 2>> "$OUT/log.txt"
    .bin/linearize bench mixers --backward --json --iters 10 > "$OUT/after-$round.json" 2>> "$OUT/log.txt"
  done
  python3 scripts/bench_fla_mixers.py --shapes 8x512x9x64,4x4096x16x128 --mixers "${FLA_MIXERS:-gated_deltanet,retnet}" --budget "${BUDGET:-300}" --out "$OUT/fla.jsonl" 2>> "$OUT/log.txt"
  ;;
fla-backward)
  python3 scripts/bench_fla_mixers.py --backward --timing-only-gated-backward --shapes 8x512x9x64,4x4096x16x128 --mixers "${FLA_MIXERS:-gated_deltanet,retnet}" --budget "${BUDGET:-420}" --out "$OUT/fla-bwd.jsonl" 2>> "$OUT/log.txt"
  ;;
coop)
  # Seven files at most under $OUT, each written as the run goes (a call killed at its limit
  # still returns what was done).
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl && export PYTHONPATH=/root/site
  B=.bin/linearize
  [ -f .exp/run/after.gz ] && gunzip -c .exp/run/after.gz > /root/after && chmod +x /root/after && B=/root/after
  if [ -f .exp/run/coop.gz ]; then
    gunzip -c .exp/run/coop.gz > /root/coop && chmod +x /root/coop
    timeout 150 /root/coop --nocapture > "$OUT/coop-test.txt" 2>&1; echo "coop tests rc=$?" >> "$OUT/coop-test.txt"
    grep -E "test result|rc=|FAILED|panicked" "$OUT/coop-test.txt" | head -5
  fi
  S=${SHAPES:-4x4096x16x128}
  M=${MIXERS:-linear_attn,retnet,gla,deltanet,gated_deltanet,kda,mamba2}
  for round in 1 2; do
    for prec in f32 mixed; do
      r=$($B bench mixers --backward --precision $prec --mixer-shapes "$S" --mixers "$M" --json --iters 10 2>> "$OUT/log.txt" | tr -d '\n ')
      echo "{\"precision\":\"$prec\",\"round\":$round,\"result\":$r}" >> "$OUT/bench.jsonl"
    done
  done
  for prec in f32 mixed; do
    LINEARIZE_PROFILE=1 $B bench mixers --backward --precision $prec --mixer-shapes "$S" --mixers "$M" --json --iters 5 >> "$OUT/profile.txt" 2>&1
  done
  python3 scripts/bench_fla_mixers.py --backward --timing-only-gated-backward --shapes "$S" --mixers "${FLA_MIXERS:-gated_deltanet}" --budget "${BUDGET:-150}" --out "$OUT/fla-bwd.jsonl" 2>> "$OUT/log.txt"
  python3 scripts/bench_fla_mixers.py --shapes "$S" --mixers "${FLA_MIXERS:-gated_deltanet}" --budget "${BUDGET:-150}" --out "$OUT/fla-fwd.jsonl" 2>> "$OUT/log.txt"
  grep -o '"precision":"[a-z0-9]*"\|"round":[0-9]\|"mixer":"[a-z_0-9]*"\|"fwd_seconds":[0-9.e-]*\|"fwd_bwd_seconds":[0-9.e-]*' "$OUT/bench.jsonl" | tr '\n' ' ' | sed 's/"precision"/\n&/g'; echo
  cat "$OUT"/fla-*.jsonl | cut -c1-200
  ;;
variants)
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  S=${SHAPES:-4x4096x16x128}
  M=${MIXERS:-linear_attn,gla,gated_deltanet}
  for v in ${VARIANTS:-after v2}; do
    gunzip -c ".exp/run/$v.gz" > "/root/$v" && chmod +x "/root/$v"
    t=coop${v#after}; t=${t/coopv/coop}
    if [ -f ".exp/run/$t.gz" ]; then
      gunzip -c ".exp/run/$t.gz" > "/root/$t" && chmod +x "/root/$t"
      timeout 120 "/root/$t" --nocapture > "$OUT/test-$v.txt" 2>&1; echo "$v tests rc=$?" | tee -a "$OUT/test-$v.txt"
    fi
    for prec in ${PRECISIONS:-mixed}; do
      "/root/$v" bench mixers --backward --precision $prec --mixer-shapes "$S" --mixers "$M" --json --iters 10 > "$OUT/$v-$prec.json" 2>> "$OUT/log.txt"
      grep -o '"fwd_bwd_seconds": *[0-9.e-]*\|"fwd_seconds": *[0-9.e-]*\|"mixer": *"[a-z_0-9]*"' "$OUT/$v-$prec.json" | paste - - - | sed "s/^/$v $prec /"
    done
    for prec in ${PROFILE_PRECISIONS:-mixed}; do
      LINEARIZE_PROFILE=1 "/root/$v" bench mixers --backward --precision $prec --mixer-shapes "$S" --mixers "$M" --iters 5 --json > "$OUT/$v-profile-$prec.json" 2> "$OUT/$v-profile-$prec.err"
      grep '^profile' "$OUT/$v-profile-$prec.err" | sed "s/^/$v $prec /"
    done
  done
  ;;
parts)
  # Where a kernel's time goes ($KERNEL: grads, chunk_bwd_grads, the default; wy,
  # chunk_bwd_wy_coop), with one binary (.bin/linearize): timing-only variants that each drop one
  # part (scripts/kernel_parts.py, as LINEARIZE_SHADER_DIR folders), profiled in $PRECISION
  # (mixed) at $SHAPES for $MIXERS, the unchanged shader first.
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  python3 scripts/kernel_parts.py "${KERNEL:-grads}" /root/parts > "$OUT/parts.txt"
  for v in main $(cut -f1 "$OUT/parts.txt"); do
    dir=/root/parts/$v; [ "$v" = main ] && dir=/nonexistent
    LINEARIZE_SHADER_DIR=$dir LINEARIZE_PROFILE=1 .bin/linearize bench mixers --backward --precision "${PRECISION:-mixed}" --mixer-shapes "${SHAPES:-4x4096x16x128}" --mixers "${MIXERS:-gated_deltanet,retnet}" --iters 5 --json > "$OUT/parts-$v.json" 2> "$OUT/parts-$v.txt"
    grep '^profile' "$OUT/parts-$v.txt" | head -6 | sed "s/^/$v /"
  done
  ;;
shaders)
  # One binary ($BIN, an .exp/run/NAME.xz or .stage/NAME.xz name, else .bin/linearize) over the
  # shader variant folders $DIRS (default: every folder in $VARIANTS_DIR, itself default .exp/var;
  # scripts/kernel_parts.py writes such folders; "main" is the embedded shaders): per variant the
  # registers, binary size and workgroup memory of each of $ENTRIES (native/chunk_sweep_coop's,
  # GATE=1 DELTA=1) and the profiled kernels of $MIXERS at $SHAPES, for $ROUNDS rounds (a first
  # run of a new shader is sometimes inflated in every kernel at once). Each step has its own
  # timeout and every line goes to $OUT/lines.txt as it comes, so a hung variant (too much
  # workgroup memory can hang the GPU) costs its timeout, not the call.
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  B=.bin/linearize
  for f in ".stage/${BIN:-}.xz" ".exp/run/${BIN:-}.xz"; do [ -n "${BIN:-}" ] && [ -f "$f" ] && xz -dc "$f" > /root/bin && chmod +x /root/bin && B=/root/bin; done
  D=${DIRS:-$(ls "${VARIANTS_DIR:-.exp/var}")}
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for v in $D; do
      dir=${VARIANTS_DIR:-.exp/var}/$v; [ "$v" = main ] && dir=/nonexistent
      regs=""
      if [ "$round" = 1 ]; then
        for e in ${ENTRIES:-chunk_prepare_coop chunk_bwd_wy_coop chunk_bwd_scores_coop}; do
          regs="$regs $e: $(LINEARIZE_SHADER_DIR=$dir timeout 30 "$B" bench registers --shader native/chunk_sweep_coop --entry "$e" --constants GATE=1,DELTA=1 2>&1 | grep -o 'Register Count [0-9]*\|Binary Size [0-9]*\|Shared Memory Size [0-9]*' | tr '\n' ' ')"
        done
      fi
      LINEARIZE_SHADER_DIR=$dir LINEARIZE_PROFILE=1 timeout "${STEP_TIMEOUT:-40}" "$B" bench mixers --backward --precision "${PRECISION:-mixed}" --mixer-shapes "${SHAPES:-4x4096x16x128}" --mixers "${MIXERS:-gated_deltanet}" --iters 5 --digest --json > /root/variant.json 2> /root/variant.txt
      rc=$?
      kernels=$(grep '^profile' /root/variant.txt | head -"${KERNELS:-7}" | awk '{print $2, $3}' | tr '\n' ' ')
      digest=$(grep -o '"digests":{[^}]*}' /root/variant.json | md5sum | cut -c1-8)
      calls=$(grep -o '"fwd_bwd_seconds":[0-9.e-]*\|"fwd_seconds":[0-9.e-]*' /root/variant.json | tr '\n' ' ')
      echo "$round $v rc=$rc $kernels $calls digests $digest |$regs" | tee -a "$OUT/lines.txt"
    done
  done
  ;;
pair)
  # A kernel change before and after in one call: the binaries named in $VERSIONS ("before
  # after"), each .stage/$v.xz or .exp/run/$v.xz (stripped, xz); `bench mixers --backward` in
  # $PRECISION (mixed) at $SHAPES, alternating for $ROUNDS rounds (with --digest: the outputs'
  # bits of every binary compared with the first's), a profiled run of each
  # binary for each of $PROFILE_MIXERS at $PROFILE_SHAPES, then fla's forward+backward and
  # forward of $FLA_MIXERS (wheels from .whl; FLA_MIXERS=none skips it) in the same call.
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl && export PYTHONPATH=/root/site
  V=${VERSIONS:-before after}
  for v in $V; do
    for f in .stage/$v.xz .exp/run/$v.xz; do [ -f "$f" ] && xz -dc "$f" > /root/$v && chmod +x /root/$v; done
  done
  S=${SHAPES:-8x512x9x64,4x4096x16x128}
  M=${MIXERS:-linear_attn,retnet,gla,deltanet,gated_deltanet,kda,mlstm,mamba2}
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for v in $V; do
      # (a binary older than --digest is timed without it)
      b=(/root/$v bench mixers --backward --precision "${PRECISION:-mixed}" --mixer-shapes "$S" --mixers "$M" --json --iters 10)
      "${b[@]}" --digest > "$OUT/$v-$round.json" 2>> "$OUT/log.txt" || "${b[@]}" > "$OUT/$v-$round.json" 2>> "$OUT/log.txt"
      # (host seconds, then the GPU's own where the binary reports them: steady when the host is not)
      grep -o '"fwd_bwd_gpu_seconds": *[0-9.e-]*\|"fwd_bwd_seconds": *[0-9.e-]*\|"fwd_gpu_seconds": *[0-9.e-]*\|"fwd_seconds": *[0-9.e-]*\|"mixer": *"[a-z_0-9]*"' "$OUT/$v-$round.json" | paste -s -d' ' | sed 's/ \("mixer":"[a-z_0-9]*"\) */ \1\n/g' | sed "/^$/d; s/^ *//; s/^/$v $round /"
    done
  done
  # Every binary's output and gradient bits against the first's (a change made for speed must
  # not move them).
  python3 - $V <<'PY'
import json, os, sys
def digests(v):
    rows = json.load(open(f"{os.environ['OUT']}/{v}-1.json"))["results"]
    return {(r["mixer"], r["head_dim"]): r["digests"] for r in rows if "digests" in r}
have = [v for v in sys.argv[1:] if digests(v)]
for v in sys.argv[1:]:
    if v not in have:
        print(f"digests {v}: none (the binary predates --digest)")
if have:
    first, base = have[0], digests(have[0])
    for v in have[1:]:
        other = digests(v)
        moved = [f"{m} D={d}: " + ",".join(k for k in base[(m, d)] if base[(m, d)][k] != other.get((m, d), {}).get(k)) for (m, d) in base if base[(m, d)] != other.get((m, d))]
        print(f"digests {v} against {first}: " + ("the same bits" if not moved else "differ in " + "; ".join(moved)))
PY
  for m in $(echo "${PROFILE_MIXERS:-gated_deltanet}" | tr , ' '); do
    for v in $V; do
      LINEARIZE_PROFILE=1 /root/$v bench mixers --backward --precision "${PRECISION:-mixed}" --mixer-shapes "${PROFILE_SHAPES:-4x4096x16x128}" --mixers "$m" --iters 5 --json > /dev/null 2> "$OUT/profile-$v-$m.txt"
      grep '^profile' "$OUT/profile-$v-$m.txt" | head -8 | sed "s/^/$v $m /"
    done
  done
  [ "${FLA_MIXERS:-}" = none ] && exit 0
  python3 scripts/bench_fla_mixers.py --backward --timing-only-gated-backward --shapes "$S" --mixers "${FLA_MIXERS:-gated_deltanet}" --budget "${BUDGET:-150}" --out "$OUT/fla.jsonl" 2>> "$OUT/log.txt"
  python3 scripts/bench_fla_mixers.py --shapes "$S" --mixers "${FLA_MIXERS:-gated_deltanet}" --budget "${BUDGET:-150}" --out "$OUT/fla.jsonl" 2>> "$OUT/log.txt"
  ;;
backward)
  for round in 1 2; do
    b="${BEFORE:-.before/linearize}"
    [ -x "$b" ] && "$b" bench mixers --backward --json --iters 10 > "$OUT/before-$round.json" 2>> "$OUT/log.txt"
    .bin/linearize bench mixers --backward --json --iters 10 > "$OUT/after-$round.json" 2>> "$OUT/log.txt"
  done
  LINEARIZE_PROFILE=1 .bin/linearize bench mixers --backward --json --iters 5 > "$OUT/profile.json" 2>> "$OUT/log.txt"
  python3 scripts/bench_fla_mixers.py --backward --timing-only-gated-backward --shapes "${SHAPES:-8x512x9x64,4x4096x16x128}" --mixers "${FLA_MIXERS:-gated_deltanet,linear_attn,retnet,gla,deltanet,kda,mamba2,mlstm}" --budget "${BUDGET:-330}" --out "$OUT/fla-bwd.jsonl" 2>> "$OUT/log.txt"
  ;;
esac
tail -3 "$OUT/log.txt"

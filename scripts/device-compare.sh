#!/usr/bin/env bash
# Runs on the lent H200, in as many calls as it takes (each picks up where the last stopped):
#   scripts/device-compare.sh DEADLINE_S LIMIT GDN_TOKENS LA_TOKENS
# 1. the teacher's zero-shot scores on the full sets (eval --out: resumable per document);
# 2. gated_deltanet and linear_attn students distilled (three stages; --resume after a cut);
# 3. `linearize compare` of the three (the teacher's records reused) with NIAH up to 4096 tokens.
# What the call before carried: /root/stage/gguf.part00, /root/stage/tok/*.gz and
# /root/stage/eval/... (scripts/device-prepare.sh); this call carries .stage/gguf.part01, .bin, .gl
# and the rest of .stage/eval. Results go to $OUT. LIMIT 0 scores every document in the comparison.
# For a rehearsal on a small machine: TEACHER_EVAL_ARGS="--limit 2", DISTILL_ARGS="--layers 2
# --seq 64 --batch 4", NIAH_LENGTHS=128,256, LINEARIZE_HOME and WORK elsewhere.
set -uo pipefail
END=$(( $(date +%s) + $1 )); LIMIT=$2; GDN_TOKENS=$3; LA_TOKENS=$4
left() { echo $(( END - $(date +%s) )); }
# A step runs until the deadline, and not at all in its last seconds.
run_for() { local l; l=$(left); [ "$l" -gt 5 ] || exit 0; timeout "$l" "$@"; }
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
export LINEARIZE_HOME=${LINEARIZE_HOME:-/root/lh}
W=${WORK:-/root/work}; B=$PWD/.bin/linearize
mkdir -p $LINEARIZE_HOME/teacher $LINEARIZE_HOME/corpus $LINEARIZE_HOME/eval $W
G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$G" ] || cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
for f in /root/stage/tok/*.gz; do t=$LINEARIZE_HOME/corpus/.$(basename "$f" .gz); [ -f "$t" ] || gunzip -c "$f" > "$t"; done
for d in /root/stage/eval .stage/eval; do [ -d $d ] && cp -rn $d/. $LINEARIZE_HOME/eval/; done
# What comes back is one archive ($OUT holds few files, two folders deep at most).
collect() {
  local keep=(teacher-eval teacher-eval.json teacher-eval.err report compare.json compare.err)
  for m in gated_deltanet linear_attn; do keep+=(distill-$m.jsonl distill-$m.err $m/metrics.jsonl $m/config.json $m/student.json); done
  (cd $W && ls -d "${keep[@]}" time-*.txt 2>/dev/null | tar czf $OUT/results.tar.gz --exclude=saturation.json -T -)
  sha256sum "$G" > $OUT/teacher.sha256; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt 2>/dev/null
  cat $W/time-*.txt 2>/dev/null; tail -c 600 $W/compare.err 2>/dev/null
}
trap collect EXIT
# 1. The teacher on the full sets.
if [ ! -s $W/teacher-eval.json ]; then
  s=$(date +%s)
  run_for $B eval --model smollm2-135m ${TEACHER_EVAL_ARGS:-} --out $W/teacher-eval --json > $W/teacher-eval.tmp 2> $W/teacher-eval.err \
    && mv $W/teacher-eval.tmp $W/teacher-eval.json
  echo "teacher eval: $(( $(date +%s) - s )) s (this call)" >> $W/time-teacher-eval.txt
fi
# 2. The students (a student is saved after each stage: done once stage 3's perplexity is out).
done_distilling() { grep -q '"model":"student","stage":3' $W/distill-$1.jsonl 2>/dev/null; }
for spec in gated_deltanet:$GDN_TOKENS linear_attn:$LA_TOKENS; do
  m=${spec%%:*}; tokens=${spec##*:}
  done_distilling $m && continue
  [ "$(left)" -gt 30 ] || exit 0
  resume=""; [ -f $W/$m/checkpoint/state.json ] && resume=--resume
  s=$(date +%s)
  run_for $B distill --mixer $m --out $W/$m --tokens $tokens --checkpoint-every 100 ${DISTILL_ARGS:-} $resume --json >> $W/distill-$m.jsonl 2>> $W/distill-$m.err
  echo "distill $m: $(( $(date +%s) - s )) s (this call)" >> $W/time-distill-$m.txt
done
# 3. The comparison (the teacher's per-document records reused).
done_distilling linear_attn || exit 0
mkdir -p $W/report/models/smollm2-135m/eval
cp -n $W/teacher-eval/*.jsonl $W/report/models/smollm2-135m/eval/ 2>/dev/null
lim=""; [ "$LIMIT" != 0 ] && lim="--limit $LIMIT"
s=$(date +%s)
run_for $B compare --models smollm2-135m,$W/gated_deltanet,$W/linear_attn --out $W/report $lim \
  --lengths ${NIAH_LENGTHS:-256,512,1024,2048,4096} --depths 0,25,50,75,100 --samples 2 --json > $W/compare.json 2> $W/compare.err
echo "compare: $(( $(date +%s) - s )) s (this call)" >> $W/time-compare.txt

#!/usr/bin/env bash
# `linearize study` on a lent GPU machine (one or two H200s), in two calls, as
# ../shared/DEVICE.md's upload (a call carries at most 64 MiB):
#   1. carry .stage/gguf.part00 .stage/eval; command `bash scripts/device-study.sh upload`
#      (.stage/eval/requests.tar: the six tasks' request files and eval/.complete, made by
#      `tar cf` in $LINEARIZE_HOME/eval; with the tree grown past 5 MiB the six no longer fit
#      beside part00: carry .stage/eval5, the same without HellaSwag, instead)
#   2. carry .stage/gguf.part01 .stage/tok .gl .bin; command
#      `bash scripts/device-study.sh run [study flags…]`
#      (.stage/tok/*.gz: the corpus's token caches, gzipped; .bin/linearize.xz: the binary)
# The study's directory goes to /root/study; its report, every job's result.json, metrics and
# log come back in $OUT/study.tgz, written again every minute while the study runs (a call cut
# at its limit still returns what was done; the study resumes with `run --resume …` on the same
# warm machine).
set -uo pipefail
if [ "${1:-}" = upload ]; then
  mkdir -p /root/stage /root/lh/eval && cp .stage/gguf.part00 /root/stage/
  for t in .stage/eval*/*.tar; do tar xf "$t" -C /root/lh/eval; done
  ls /root/stage /root/lh/eval/oe_eval_tasks
  exit 0
fi
shift
source scripts/device-common.sh
device_vulkan
device_teacher .stage/tok
cat $OUT/teacher.sha256
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.bin/linearize.xz'), open('/root/linearize', 'wb'))" && chmod +x /root/linearize
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
pack() {
  tar czf $OUT/study.tgz -C /root/study --exclude='*.safetensors' --exclude=checkpoint --exclude=snapshots --exclude=tokenizer.json --exclude=eval --exclude=saturation.json --exclude=log.txt . 2> /dev/null
}
( while sleep 60; do pack; done ) &
packer=$!
timeout ${SECONDS_LEFT:-540} /root/linearize study --out /root/study "$@" > $OUT/study.out 2> $OUT/study.err
rc=$?
echo "study rc=$rc" | tee -a $OUT/study.err
# Cut at its limit: the report of what is done (the study resumes with `run --resume …`).
[ $rc = 0 ] || /root/linearize study --out /root/study --report > $OUT/report.out 2>> $OUT/study.err
kill $packer 2> /dev/null
pack
tail -30 $OUT/study.out

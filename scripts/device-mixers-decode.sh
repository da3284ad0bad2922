#!/usr/bin/env bash
# Batch-1 decode of an untrained student of every mixer on the lent H200, two binaries
# alternating (.exp/dec/before.xz and after.xz), and each one's greedy continuation (must be the
# same). The teacher travels in three parts (`split -b 34M -d GGUF .stage/p3.`), so the calls
# stay under 64 MiB with the binaries: call 1 carries .gl .exp/dec .stage/p3.00 (unpack the
# binaries to /root/{before,after}, copy p3.00 to /root/stage), call 2 .stage/p3.01 (copy it),
# call 3 .gl .stage/p3.02 and this script (copied under .exp): `bash .exp/mixers-decode.sh`.
set -uo pipefail
source scripts/device-common.sh
device_vulkan
unxz() { python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$1" "$2" && chmod +x "$2"; }
for v in before after; do [ -f /root/$v ] || unxz .exp/dec/$v.xz /root/$v; done
mkdir -p /root/lh/teacher && G=/root/lh/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f $G ] || cat /root/stage/p3.00 /root/stage/p3.01 .stage/p3.02 > $G
export LINEARIZE_HOME=/root/lh
sha256sum $G | cut -c1-16
R=$OUT && P="The history of the printing press begins"
for m in linear_attn retnet gla deltanet gated_deltanet kda mlstm mamba2; do
  /root/after student --mixer $m --out /root/s-$m > /dev/null 2>> $R/student.err
  for round in $(seq ${ROUNDS:-2}); do for v in before after; do
    timeout 60 /root/$v bench teacher --model /root/s-$m --precision mixed --prefill "" --decode 512 --decode-tokens 128 --iters 1 --json > $R/$m-$v-$round.json 2>> $R/bench.err
    echo "$m $v $round $(grep -o '"tokens_per_second":[0-9.]*' $R/$m-$v-$round.json)"
  done; done
  for v in before after; do timeout 60 /root/$v generate --model /root/s-$m --prompt "$P" --max-new-tokens 32 --json > $R/$m-gen-$v.json 2>> $R/gen.err; done
  python3 -c "import json,sys; a,b=(json.load(open(f))['ids'] for f in sys.argv[1:]); print('$m generate:', 'same' if a==b else 'DIFFERENT', len(a))" $R/$m-gen-before.json $R/$m-gen-after.json
done

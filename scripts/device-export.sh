#!/usr/bin/env bash
# Students exported for flash-linear-attention, checked in PyTorch on the lent H200 (issue 17
# item 1), in two calls back to back (the teacher's two-part upload of ../shared/DEVICE.md):
#   1. `bash scripts/device-export.sh upload`: carry .gl .stage/gguf.part00 .whl .exp/export
#      (.exp/export/linearize.xz: the binary); stages them in /root/stage.
#   2. `bash scripts/device-export.sh check [STUDENT…]`: carry .gl .stage/gguf.part01 .stage/tok.
#      Distils each student briefly — gdn (gated DeltaNet), hybrid (gated DeltaNet with softmax
#      attention kept in blocks 7, 15 and 23), gla, gla-conv (GLA with --conv-all-mixers),
#      deltanet, retnet, kda; all by default — exports it with `linearize export --to fla`, and
#      compares it with fla 0.6.0 + transformers (scripts/check_fla_export.py): the prompt's
#      logits and the greedy continuation. Results in $OUT/res.tgz as they come.
#      `TO=hf`: `export --to hf` instead, checked by scripts/check_hf_export.py with the
#      machine's own transformers (remote code; no fla, so call 1 needs no .whl); students
#      also la (linear attention), mlstm and mamba2.
set -uo pipefail
source scripts/device-common.sh
device_vulkan
R=/root/res && mkdir -p $R
save() { tar czf $OUT/res.tgz -C $R .; }
case "$1" in
upload)
  mkdir -p /root/stage && cp .stage/gguf.part00 /root/stage/ && cp .exp/export/linearize.xz /root/stage/
  [ -d .whl ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /root/site .whl/*.whl
  ls -la /root/stage; ls /root/site | head
  ;;
check)
  device_teacher .stage/tok
  B=/root/linearize
  python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('/root/stage/linearize.xz'), open('$B', 'wb'))" && chmod +x $B
  export PYTHONPATH=/root/site
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt
  HYBRID=$(python3 -c "print(','.join(str(i) for i in range(30) if i not in (7, 15, 23)))")
  P="The capital of France is Paris. The history of the printing press begins"
  shift
  TO=${TO:-fla}
  students=("$@"); [ ${#students[@]} -eq 0 ] && students=(gdn hybrid gla gla-conv deltanet retnet kda)
  for s in "${students[@]}"; do
    case $s in
      gdn) flags=(--mixer gated_deltanet) ;;
      hybrid) flags=(--mixer gated_deltanet --mixer-layers "$HYBRID") ;;
      gla-conv) flags=(--mixer gla --conv-all-mixers) ;;
      la) flags=(--mixer linear_attn) ;;
      *) flags=(--mixer $s) ;;
    esac
    timeout 200 $B distill "${flags[@]}" --tokens ${TOKENS:-600000} --heldout-tokens 4096 --checkpoint-every 1000 --json --out /root/$s > $R/distill-$s.jsonl 2> $R/distill-$s.err
    tail -c 300 $R/distill-$s.jsonl; echo
    $B export --to $TO /root/$s /root/$s-$TO > $R/export-$s.txt 2>&1; cat $R/export-$s.txt
    $B generate --model /root/$s --prompt "$P" --max-new-tokens 24 --logits $R/logits-$s.bin --json > $R/ours-$s.json 2>> $R/generate.err
    timeout 300 python3 scripts/check_${TO}_export.py /root/$s-$TO $R/ours-$s.json $R/logits-$s.bin > $R/check-$s.json 2> $R/check-$s.err
    cat $R/check-$s.json; tail -3 $R/check-$s.err
    rm -f $R/logits-$s.bin
    save
  done
  ;;
esac

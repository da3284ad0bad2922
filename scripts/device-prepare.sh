#!/usr/bin/env bash
# Prepares what a run on the lent GPU machine carries (all in git-ignored folders):
#   .gl/     Vulkan loader packages (the machine has the NVIDIA driver but no loader)
#   .bin/    the release `linearize` binary
#   .stage/  the teacher GGUF split in two parts (one call may carry 64 MiB), and the corpus's
#            token cache gzipped (.stage/tok), so the machine needs no text
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d .gl ] || [ -z "$(ls .gl/*.deb 2>/dev/null)" ]; then
  L=$(mktemp -d); mkdir -p .gl "$L/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$L"
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
cargo build --release -p linearize
mkdir -p .bin .stage
cp target/release/linearize .bin/
strip .bin/linearize || true
GGUF="${LINEARIZE_HOME:-$HOME/.cache/linearize}/teacher/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f .stage/gguf.part01 ] || split -b 48M -d "$GGUF" .stage/gguf.part
mkdir -p .stage/tok
for f in "${LINEARIZE_HOME:-$HOME/.cache/linearize}"/corpus/.tokens-*.bin; do
  [ -f "$f" ] && gzip -9 -c "$f" > ".stage/tok/$(basename "$f" | sed 's/^\.//').gz"
done
ls -la .gl .bin .stage

#!/usr/bin/env bash
# Installs everything linearize's build and tests need on a fresh Debian machine, then fetches
# the assets. Idempotent: a second run only checks.
#   - lavapipe (Mesa's Vulkan on the CPU) for machines without a GPU
#   - Debian's chromium and chromedriver for the browser test
#   - Open MPI and libclang for data-parallel distillation (tests/parallel.rs)
#   - the wasm32 target and the wasm-bindgen CLI matching Cargo.lock
#   - the teacher, evaluation sets and text (`linearize fetch all`)
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || [ -n "$(ls /usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null)" ] || need_apt+=(mesa-vulkan-drivers libvulkan1)
command -v chromium >/dev/null || need_apt+=(chromium chromium-driver)
command -v npm >/dev/null || need_apt+=(npm)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
# Open MPI and libclang (the mpi crate's bindings) for data-parallel distillation (--features mpi).
command -v mpicc >/dev/null || need_apt+=(libopenmpi-dev openmpi-bin)
[ -n "$(ls /usr/lib/llvm-*/lib/libclang.so* 2>/dev/null)" ] || need_apt+=(libclang-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

want=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}') || true
if [ "$have" != "$want" ]; then
  echo "setup: cargo install wasm-bindgen-cli --version $want"
  cargo install -q wasm-bindgen-cli --version "$want"
fi

cargo run -q --release -p linearize -- fetch all

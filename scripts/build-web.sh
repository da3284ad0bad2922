#!/usr/bin/env bash
# Builds the browser package: the `web` crate for wasm32, bound with the wasm-bindgen CLI whose
# version matches the wasm-bindgen crate in Cargo.lock (installed by scripts/setup.sh).
# Output: www/pkg/ (linearize_web.js + linearize_web_bg.wasm). Usage: scripts/build-web.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-www/pkg}"
want=$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)
have=$(wasm-bindgen --version 2>/dev/null | awk '{print $2}') || true
if [ "$have" != "$want" ]; then
  echo "wasm-bindgen CLI $want is needed (found '${have:-none}'): cargo install wasm-bindgen-cli --version $want" >&2
  exit 1
fi
target_dir="${CARGO_TARGET_DIR:-target}"
cargo build -q -p linearize-web --target wasm32-unknown-unknown --release
wasm-bindgen --target web --no-typescript --out-dir "$out" "$target_dir/wasm32-unknown-unknown/release/linearize_web.wasm"
echo "wrote $out"

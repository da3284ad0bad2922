# Sourced by the scripts/device-*.sh that run the real teacher on a lent GPU machine
# (../shared/DEVICE.md): the Vulkan loader from the carried .gl debs, and $LINEARIZE_HOME with
# the teacher (its first part uploaded to /root/stage by the call before, the second carried in
# .stage/) and the corpus's token caches (gzipped, in the directory given).
device_vulkan() {
  for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
}
device_teacher() { # TOKEN_CACHE_DIR
  export LINEARIZE_HOME=/root/lh
  mkdir -p $LINEARIZE_HOME/teacher $LINEARIZE_HOME/corpus
  G=$LINEARIZE_HOME/teacher/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$G" ] || cat /root/stage/gguf.part00 .stage/gguf.part01 > "$G"
  sha256sum "$G" > $OUT/teacher.sha256
  for f in "$1"/*.gz; do gunzip -c "$f" > $LINEARIZE_HOME/corpus/.$(basename "$f" .gz); done
}

#!/usr/bin/env bash
# scripts/gpu-check.sh where no GPU is visible, in the suite's own build folder: it must build what
# the GPU checks run, write the report with every section and the reason each GPU part was
# skipped, and exit 0.
# usage: without_gpu.sh SOURCE_DIR BUILD_DIR OUT_DIR
set -euo pipefail
source_dir=$1
build_dir=$2
out=$3
rm -rf "$out"
CUDA_VISIBLE_DEVICES= GPU_CHECK_INSTALL_DEPS=0 GPU_CHECK_BUILD_DIR="$build_dir" \
  bash "$source_dir/scripts/gpu-check.sh" "$out" >/dev/null
report="$out/report.md"
expect() {
  if ! grep -qF -- "$1" "$report"; then
    echo "report.md lacks: $1" >&2
    cat "$report" >&2
    exit 1
  fi
}
expect "# zeroshard GPU check"
expect "- GPU: none: CUDA_VISIBLE_DEVICES='' hides every GPU"
expect "## Build"
expect "targets built in"
expect "## Host"
expect "- CPUs in this process's affinity mask:"
expect "skipped: CUDA_VISIBLE_DEVICES='' hides every GPU (GPU_CHECK_HOST_SWEEP=1 runs it)"
for section in "Host update: every thread count" "ctest -L gpu" "Kernel benchmarks" \
  "Offloaded AdamW after backward vs during it" "Offload training runs" \
  "libtorch: the torch GPT on the GPU" "Against DeepSpeed ZeRO-3 and FSDP2"; do
  expect "## $section"
done
if [[ $(grep -c "^skipped: CUDA_VISIBLE_DEVICES='' hides every GPU$" "$report") != 6 ]]; then
  echo "report.md: the six GPU sections must each say why they were skipped" >&2
  cat "$report" >&2
  exit 1
fi
expect "nothing failed"
# Each program the GPU checks run was built.
for program in benchmarks/bench_kernels examples/mlp/zeroshard-train-mlp zeroshard-estimate; do
  [[ -x "$build_dir/$program" ]] || { echo "not built: $program" >&2; exit 1; }
done
echo "gpu-check.sh without a GPU: built, skipped with the reason, report complete"

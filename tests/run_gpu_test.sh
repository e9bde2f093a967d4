#!/usr/bin/env bash
# Runs one gtest program of the gpu label. A failing case fails it; otherwise, when cases skipped
# for want of a GPU (or of the CUDA build), it exits 77, which ctest reports as Skipped rather
# than Passed; the cases that need no GPU have still run.
set -uo pipefail
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if ((status != 0)); then
  exit "$status"
fi
if grep -qE 'no usable CUDA device|zeroshard was built without CUDA' <<<"$output"; then
  echo "SKIPPED: cases of $(basename "${@: -1}") need a GPU (reason above)"
  exit 77
fi

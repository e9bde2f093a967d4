#!/usr/bin/env bash
# The one call for a machine with a GPU: builds what the GPU checks need with every core, runs the
# gpu-labelled tests, the CUDA kernel benchmarks, an offload training run of the largest MLP the
# machine holds (stage 3, bf16, the optimizer on the host) and the same model trained by DeepSpeed
# and FSDP2 beside zeroshard (benchmarks/compare_peers), and writes one report, report.md, with
# its logs to OUT_DIR. Without a GPU it still builds, says why it skipped the rest, and writes the
# report. Exit status: 0 when nothing failed (skips included), 1 otherwise.
#
#   bash scripts/gpu-check.sh OUT_DIR
#
# ZEROSHARD_DEPS_BUNDLE=DIR: on a machine that cannot reach a package registry, unpack the
#   packages scripts/bundle_deps.sh downloaded into DIR (never over a file already there) instead
#   of running scripts/install_deps.sh, and install DeepSpeed from DIR/wheels for the comparison.
# GPU_CHECK_INSTALL_DEPS=0: the packages are installed already; install nothing.
# GPU_CHECK_BUILD_DIR (build-gpu; one configured already is built as it is configured),
# GPU_CHECK_BUDGET (s for the whole script, 570: a section that would not finish in what is left
# is skipped and says so), GPU_CHECK_TEST_TIMEOUT (s per test, 120), GPU_CHECK_TESTS_LIMIT (s for
# all tests, 120), GPU_CHECK_OFFLOAD_LIMIT (s for each offload run, 120), GPU_CHECK_STEPS (3),
# GPU_CHECK_PARAMS (the offload runs' parameters; default: the largest the estimator fits),
# GPU_CHECK_HOST_SWEEP=1 (run the host's thread sweep without a GPU too), GPU_CHECK_COMPARE_LIMIT
# (s for the comparison with DeepSpeed and FSDP2, 300), GPU_CHECK_COMPARE_PARAMS (its parameters;
# default: the offload runs'), GPU_CHECK_PYTHON (the Python whose PyTorch the libtorch adapter
# builds against and the comparison runs with, python3), GPU_CHECK_SECTIONS (a comma list of
# sweep, offload, compare, kernels, tests, overlap, torch: only those run, e.g. the offload work in
# one call and the rest in a second on the same build; the offload runs' size is chosen either
# way).
# CUDA_VISIBLE_DEVICES set empty (or -1) hides the GPUs, as it does from CUDA.
#
# Order: what the offload work needs first (the host, the thread sweep, the offload runs with and
# without super_offload, the comparison), then the kernel benchmarks, the gpu tests and the overlap
# benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."

if (($# != 1)); then
  echo "usage: scripts/gpu-check.sh OUT_DIR" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd)
build=${GPU_CHECK_BUILD_DIR:-build-gpu}
budget=${GPU_CHECK_BUDGET:-570}
test_timeout=${GPU_CHECK_TEST_TIMEOUT:-120}
tests_limit=${GPU_CHECK_TESTS_LIMIT:-120}
offload_limit=${GPU_CHECK_OFFLOAD_LIMIT:-120}
compare_limit=${GPU_CHECK_COMPARE_LIMIT:-300}
torch_python=${GPU_CHECK_PYTHON:-python3}
steps=${GPU_CHECK_STEPS:-3}
report="$out/report.md"
started=$(date +%s)
failed=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

elapsed() { echo "$(($(date +%s) - started)) s"; }
# Seconds of the budget left, and whether a section of at most $1 s still fits (it says when not).
left() { echo $((budget - ($(date +%s) - started))); }
fits() {
  if (($(left) < $1)); then
    echo "skipped: $(left) s of the ${budget} s budget left, the section may take $1 s" >>"$report"
    return 1
  fi
}
section() { printf '\n## %s\n\n' "$1" >>"$report"; }
# Whether GPU_CHECK_SECTIONS (unset: all) names section $1; when not, the report says so.
asked() {
  if [[ -z "${GPU_CHECK_SECTIONS:-}" || ",$GPU_CHECK_SECTIONS," == *",$1,"* ]]; then return 0; fi
  echo "not asked for (GPU_CHECK_SECTIONS=$GPU_CHECK_SECTIONS)" >>"$report"
  return 1
}
# Runs "$@" with its output in $out/$log; the last lines go to the report when it fails.
logged() {
  local log=$1
  shift
  "$@" >"$out/$log" 2>&1
  local status=$?
  if ((status != 0)); then
    printf 'failed (exit %d): `%s`; the end of %s:\n\n```\n%s\n```\n' "$status" "$*" "$log" \
      "$(tail -n 25 "$out/$log")" >>"$report"
  fi
  return "$status"
}

{
  echo "# zeroshard GPU check"
  echo
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet \
    2>/dev/null || echo ' (with uncommitted changes)')"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' \
    /proc/meminfo) memory"
} >"$report"

# --- dependencies ---------------------------------------------------------------------------
install_bundle() {
  local bundle=$1 deb link target
  for deb in "$bundle"/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x --skip-old-files -C / || return 1
  done
  while read -r link target; do
    if [[ ! -e "$link" && ! -L "$link" && -e "$target" ]]; then
      mkdir -p "$(dirname "$link")" && ln -s "$target" "$link"
    fi
  done <"$bundle/links.txt"
  ldconfig
}
section "Set-up"
if [[ "${GPU_CHECK_INSTALL_DEPS:-1}" == 0 ]]; then
  echo "- packages: taken as installed (GPU_CHECK_INSTALL_DEPS=0)" >>"$report"
elif [[ -n "${ZEROSHARD_DEPS_BUNDLE:-}" ]]; then
  logged deps.log install_bundle "$ZEROSHARD_DEPS_BUNDLE" && echo "- packages: unpacked from" \
    "$ZEROSHARD_DEPS_BUNDLE ($(ls "$ZEROSHARD_DEPS_BUNDLE"/*.deb | wc -l) .deb files)" >>"$report"
else
  logged deps.log bash scripts/install_deps.sh && echo "- packages: scripts/install_deps.sh" \
    >>"$report"
fi

gpu_reason=""
if [[ -v CUDA_VISIBLE_DEVICES && ( -z "$CUDA_VISIBLE_DEVICES" || "$CUDA_VISIBLE_DEVICES" == -1 ) ]]
then
  gpu_reason="CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES' hides every GPU"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_reason="nvidia-smi is not on PATH (no NVIDIA driver)"
elif ! gpu_line=$(nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version \
  --format=csv,noheader,nounits 2>&1 | head -n 1) || [[ -z "$gpu_line" ]]; then
  gpu_reason="nvidia-smi found no GPU: ${gpu_line:-no output}"
fi
cuda_architectures=90
if [[ -z "$gpu_reason" ]]; then
  IFS=', ' read -r -a gpu_fields <<<"$(tr -s ' ' <<<"${gpu_line//, /,}" | tr ',' ' ')"
  gpu_memory_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
  cuda_architectures=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 |
    tr -d '.')
  echo "- GPU: $gpu_line (name, MiB, compute capability, driver)" >>"$report"
else
  echo "- GPU: none: $gpu_reason" >>"$report"
fi
echo "- nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version) |
  grep -o 'release [0-9.]*' | head -n 1)" >>"$report"

# --- the host: what the offloaded update runs on --------------------------------------------
section "Host"
{
  lscpu 2>/dev/null | grep -E '^(Model name|Socket\(s\)|Core\(s\) per socket|Thread\(s\) per core|NUMA node)' |
    sed 's/  */ /g; s/^/- /'
  echo "- vector extensions: $(grep -m1 -o -wE 'avx2|f16c|avx512f|avx512bw' /proc/cpuinfo 2>/dev/null |
    sort -u | paste -sd ' ')"
  echo "- transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null ||
    echo unknown)"
  echo "- CPUs in this process's affinity mask: $(nproc)"
} >>"$report"

# --- build ----------------------------------------------------------------------------------
section "Build"
build_start=$(date +%s)
if [[ -f "$build/CMakeCache.txt" ]]; then
  echo "- build folder $build: configured already, built as it is" >>"$report"
else
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
  # The machine's own PyTorch, where GPU_CHECK_PYTHON imports one: the libtorch adapter then
  # builds against its libtorch, and its gpu-labelled cases run with the others.
  torch_prefix=()
  if torch_line=$("$torch_python" -c 'import torch, torch.utils; print(torch.utils.cmake_prefix_path,
torch.__version__, torch.version.cuda)' 2>/dev/null); then
    read -r torch_path torch_version torch_cuda <<<"$torch_line"
    torch_prefix=(-DCMAKE_PREFIX_PATH="$torch_path")
    echo "- PyTorch: $torch_version (CUDA $torch_cuda), its libtorch at $torch_path" >>"$report"
  else
    echo "- PyTorch: $torch_python cannot import torch; the libtorch adapter is not built" \
      >>"$report"
  fi
  logged configure.log cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DZEROSHARD_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$cuda_architectures" "${torch_prefix[@]}" ||
    failed=1
  grep -m1 'libtorch adapter skipped' "$out/configure.log" | sed 's/^-- /- /' >>"$report"
fi
# What the gpu label runs (with the fixtures its cases need), the kernel benchmarks, the trainer
# and the estimator: a program is named by its path in a test's command.
targets=()
if ((failed == 0)); then
  ctest --test-dir "$build" -L gpu --show-only=json-v1 >"$out/gpu-tests.json" 2>/dev/null
  cmake --build "$build" --target help 2>/dev/null |
    sed -n 's/^\.\.\. \([^ ]*\).*/\1/p; s/^\([A-Za-z0-9_.-]*\): .*/\1/p' >"$out/targets.txt"
  mapfile -t targets < <(python3 - "$out/gpu-tests.json" "$(cd "$build" && pwd)" \
    "$out/targets.txt" <<'EOF'
import json, os, sys
tests = json.load(open(sys.argv[1]))["tests"]
known = set(open(sys.argv[3]).read().split())
wanted = set()
for test in tests:
    for argument in test.get("command", []):
        path = argument.split("=", 1)[-1]
        if path.startswith(sys.argv[2] + "/"):
            wanted.add(os.path.basename(path))
# ctest lists no command for a case whose program it cannot find yet: the example checkers.
always = {"bench_kernels", "bench_cpu_optimizer", "zeroshard-offload-step-bench",
          "zeroshard-train-mlp", "zeroshard-estimate",
          "zeroshard-overlap-bench", "zeroshard-train-torch-gpt"}
always |= {name for name in known if name.startswith("zeroshard-check-")}
# Those the build does not define (the torch GPT without a usable libtorch) are left out.
print("\n".join(sorted((wanted | always) & known)))
EOF
  )
  logged build.log cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" || failed=1
fi
echo "- ${#targets[@]} targets built in $(($(date +%s) - build_start)) s with $(nproc) jobs" \
  "($(sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p; s/^CMAKE_CUDA_ARCHITECTURES:STRING=/CUDA architectures /p' \
  "$build/CMakeCache.txt" 2>/dev/null | paste -sd ' '))" >>"$report"
grep -c 'warning:' "$out/build.log" 2>/dev/null | xargs -I{} echo "- compiler warnings: {}" \
  >>"$report"
build_failed=$failed

# --- the host's update on every thread count ---------------------------------------------------
section "Host update: every thread count"
if ! asked sweep; then
  :
elif [[ ! -x "$build/benchmarks/bench_cpu_optimizer" ]]; then
  echo "not run: the benchmark did not build" >>"$report"
elif [[ -n "$gpu_reason" && "${GPU_CHECK_HOST_SWEEP:-0}" != 1 ]]; then
  echo "skipped: $gpu_reason (GPU_CHECK_HOST_SWEEP=1 runs it)" >>"$report"
elif fits 150; then
  # Each update against a stream of its bytes at the same thread count (the stream is the host's
  # memory bandwidth there), and the norm scan against its update, on the vector paths: 1, 2, 4,
  # ... threads up to the CPUs of this process, 3 alternated rounds of 100M parameters.
  if ZEROSHARD_BENCH_ROUNDS=3 logged bench-cpu.log timeout 150 \
    "$build/benchmarks/bench_cpu_optimizer" --benchmark_filter='^$'; then
    printf '```\n%s\n```\n' "$(sed -n '/^alternated/,$p' "$out/bench-cpu.log" | grep -v scalar)" \
      >>"$report"
  else
    failed=1
  fi
  # An offloaded step's update phase (scan, norm waits, rule) against the bare pass over as many
  # elements, on the same thread counts: what the engine adds to the kernels above.
  if fits 60; then
    if logged offload-step.log timeout 60 \
      "$build/benchmarks/zeroshard-offload-step-bench" --rounds 5 --check; then
      printf '```\n%s\n```\n' "$(cat "$out/offload-step.log")" >>"$report"
    else
      failed=1
    fi
  fi
fi

# --- the offload run ------------------------------------------------------------------------
section "Offload training runs (stage 3, bf16, optimizer on the host)"
offload_config="$out/offload-config.json"
cat >"$offload_config" <<'EOF'
{
  "train_micro_batch_size_per_gpu": 16,
  "gradient_clipping": 1.0,
  "steps_per_print": 1,
  "wall_clock_breakdown": true,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 0.0001, "weight_decay": 0.01}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "cpu", "pin_memory": true}
  }
}
EOF
if [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif [[ ! -x "$build/examples/mlp/zeroshard-train-mlp" || ! -x "$build/zeroshard-estimate" ]]; then
  echo "not run: the trainer or the estimator did not build" >>"$report"
  failed=1
else
  host_mib=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
  # The largest MLP whose estimate fits 85% of the GPU and 75% of the host's available memory
  # (the rest: CUDA contexts, the trainer's own buffers, the page cache). Square layers of 8192.
  sizing=$(python3 - "$build/zeroshard-estimate" "$offload_config" "$gpu_memory_mib" "$host_mib" \
    "${GPU_CHECK_PARAMS:-}" <<'EOF'
import json, subprocess, sys
estimate, config, gpu_mib, host_mib, forced = sys.argv[1:6]
width, inputs, classes = 8192, 1024, 16
def params(layers):
    return inputs * width + width + (layers - 2) * (width * width + width) + width * classes + classes
def figures(p, ratio=1.0):
    text = subprocess.run([estimate, "--config", config, "--params", str(p), "--json",
                           "--largest-tensor", str(width * width), "--offload-ratio", str(ratio)],
                          check=True, capture_output=True, text=True).stdout
    e = json.loads(text)[0]
    return e["device"]["peak"], e["host"]["total"]
gpu, host = int(gpu_mib) << 20, int(host_mib) << 20
layers = 3
if forced:
    layers = max(3, round((int(float(forced)) - params(2)) / (width * width + width)) + 2)
else:
    while True:
        device, host_bytes = figures(params(layers + 1))
        if device > 0.85 * gpu or host_bytes > 0.75 * host:
            break
        layers += 1
device, host_bytes = figures(params(layers))
# Partial offload: the smallest host share (in steps of 0.05) whose estimate still fits 85% of
# the GPU, the rest of the optimizer updated there.
ratio = 1.0
for step in range(1, 20):
    if figures(params(layers), step / 20)[0] <= 0.85 * gpu:
        ratio = step / 20
        break
partial_device, partial_host = figures(params(layers), ratio)
print(layers, params(layers), device, host_bytes, width, inputs, classes, ratio, partial_device,
      partial_host)
EOF
  )
  read -r layers offload_params estimate_device estimate_host width inputs classes ratio \
    partial_device partial_host <<<"$sizing"
  if [[ -z "${layers:-}" ]]; then
    echo "not run: the estimator gave no size (see above)" >>"$report"
    failed=1
  # The size is chosen either way: the comparison below trains the same model.
  elif asked offload; then
    # after/during: the whole optimizer on the host, updated after backward or during it
    # (super_offload); auto-*: the same with offload_optimizer.ratio "auto", which moves what
    # the GPU can hold after the first step to the GPU. The estimate beside them is the
    # estimator's own pick: the smallest ratio whose estimate fits 85% of the GPU.
    for variant in after during auto-after auto-during; do
      config="$out/offload-config-$variant.json"
      keys='"pin_memory": true'
      [[ $variant == *during ]] && keys+=', "super_offload": true'
      [[ $variant == auto-* ]] && keys+=', "ratio": "auto"'
      sed "s/\"pin_memory\": true}/$keys}/" "$offload_config" >"$config"
      printf '\n### The update %s backward%s%s\n\n' "${variant#auto-}" \
        "$([[ $variant == *during ]] && echo ' (super_offload)')" \
        "$([[ $variant == auto-* ]] && echo ", offload_optimizer.ratio \"auto\" (the estimate beside it: ratio $ratio)")" >>"$report"
      fits $((offload_limit + 10)) || continue
      run_start=$(date +%s)
      logged "offload-$variant.log" timeout "$offload_limit" \
        "$build/examples/mlp/zeroshard-train-mlp" --config "$config" \
        --device cuda --steps "$steps" --layers "$layers" --width "$width" --inputs "$inputs" \
        --classes "$classes" --report-json "$out/offload-report-$variant.json" || failed=1
      python3 - "$out/offload-$variant.log" "$out/offload-report-$variant.json" \
        "$offload_params" "$([[ $variant == auto-* ]] && echo "$partial_device" || echo "$estimate_device")" \
        "$([[ $variant == auto-* ]] && echo "$partial_host" || echo "$estimate_host")" \
        "$(($(date +%s) - run_start))" \
        "$layers" "$width" >>"$report" <<'EOF'
import json, os, re, sys
log, report_path, params, est_device, est_host, seconds, layers, width = sys.argv[1:9]
gib = lambda b: f"{int(b) / 2**30:.2f} GiB"
trainer, engine = {}, {}
for line in open(log):
    m = re.match(r"step +(\d+)/\d+ .*\| +([\d.]+) ms/step \(step\(\) ([\d.]+)\)", line)
    if m:
        trainer[int(m[1])] = (float(m[2]), float(m[3]))
    m = re.match(r".*step (\d+) \| lr .*reduce ([\d.e+-]+) ms \| update ([\d.e+-]+) ms \| gather "
                 r"([\d.e+-]+) ms(?:.*update = scan ([\d.e+-]+) ms \+ norm waits ([\d.e+-]+) ms "
                 r"\+ rule ([\d.e+-]+) ms)?(?:.*copy wait ([\d.e+-]+) ms)?"
                 r"(?:.*scan as gradients landed ([\d.e+-]+) ms, ([\d.e+-]+) tiles)?", line)
    if m:
        engine[int(m[1])] = [float(x) if x else 0.0 for x in m.groups()[1:]]
print(f"MLP of {layers} layers of width {width}: {int(params) / 1e9:.2f}B parameters; "
      f"{seconds} s in all (set-up, {len(trainer)} steps, checksums).\n")
for line in open(log):
    if 'offload_optimizer.ratio "auto": ' in line:
        print(f"Chosen after the first step: `{line.strip()}`\n")
print("| step | ms/step | forward + backward | step() | reduce | CPU update | of it: scan | "
      "norm waits | rule | host-device copy wait | gather | scan as landed (tiles) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for step, (total, stepping) in sorted(trainer.items()):
    reduce, update, gather, scan, norm, rule, wait, landed, tiles = engine.get(step, [0.0] * 9)
    print(f"| {step} | {total:.0f} | {total - stepping:.0f} | {stepping:.0f} | {reduce:.0f} | "
          f"{update - wait:.0f} | {scan:.0f} | {norm:.0f} | {rule:.0f} | {wait:.0f} | "
          f"{gather:.0f} | {landed:.0f} ({tiles:.0f}) |")
print("\nforward + backward: the model's GPU compute and its gathers; CPU update: the update's "
      "time less its waits on copies (scan: the gradient-norm scan; norm waits: the wait for "
      "super_offload's thread and the ranks' sum; rule: the update rule's pass, or keeping the "
      "overlapped one); copy wait: the host blocked on device-host copies in backward and the "
      "update; scan as landed: the scan's tiles summed as their gradients landed during "
      "backward, which the step's scan adds instead of reading them. The update's rate: "
      "parameters / (rule time).\n")
if os.path.exists(report_path):
    memory = json.load(open(report_path))["memory"][0]
    print("| memory per rank | measured peak | estimate | measured / estimate |")
    print("| --- | --- | --- | --- |")
    for name, estimated in (("device", est_device), ("host", est_host)):
        measured = memory[name]["total_peak"]
        print(f"| {name} | {gib(measured)} | {gib(estimated)} | "
              f"{measured / max(1, int(estimated)):.3f} |")
    print(f"\nThe process's peak resident host memory: {gib(memory['process_peak_rss'])} (the "
          "trainer's own buffers and the CUDA runtime's included).")
else:
    print("no memory report (the run failed)")
EOF
    done
  fi
fi

# --- against DeepSpeed and FSDP2 -------------------------------------------------------------
section "Against DeepSpeed ZeRO-3 and FSDP2, optimizer on the host (benchmarks/compare_peers)"
if ! asked compare; then
  :
elif [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif [[ -z "${layers:-}" ]]; then
  echo "not run: no offload size was chosen (see above)" >>"$report"
elif fits $((compare_limit + 30)); then
  # DeepSpeed goes into the machine's PyTorch environment: from the bundle's wheels where there is
  # no registry, from PyPI's sdist otherwise. Not installed, it is reported as skipped.
  pip_install() {
    "$torch_python" -m pip install --quiet --disable-pip-version-check "$@" ||
      "$torch_python" -m pip install --quiet --disable-pip-version-check \
        --break-system-packages "$@"
  }
  if ! "$torch_python" -c "import deepspeed" 2>/dev/null; then
    if [[ -n "${ZEROSHARD_DEPS_BUNDLE:-}" ]]; then
      logged deepspeed-install.log pip_install --no-index \
        --find-links "$ZEROSHARD_DEPS_BUNDLE/wheels" deepspeed
    else
      logged deepspeed-install.log pip_install --no-build-isolation deepspeed==0.19.8
    fi
  fi
  # The offload runs' model and batch, bf16; DeepSpeed's partial offload at the estimator's ratio
  # above. Each framework once, alternated, 3 steps (the first left out of the times).
  compare_layers=$layers
  if [[ -n "${GPU_CHECK_COMPARE_PARAMS:-}" ]]; then
    compare_layers=$(python3 -c "import sys; p, w, i, c = map(int, sys.argv[1:]); \
print(max(3, round((p - (i * w + w + w * c + c)) / (w * w + w)) + 2))" \
      "${GPU_CHECK_COMPARE_PARAMS%.*}" "$width" "$inputs" "$classes")
  fi
  frameworks=zeroshard,deepspeed
  [[ $ratio != 1.0 ]] && frameworks+=,deepspeed-ratio
  frameworks+=,fsdp2
  TORCH_EXTENSIONS_DIR="$build/torch_extensions" "$torch_python" \
    benchmarks/compare_peers/compare.py --device cuda --ranks 1 --steps "$steps" --rounds 1 \
    --frameworks "$frameworks" --ratio "$ratio" \
    --layers "$compare_layers" --width "$width" --inputs "$inputs" --classes "$classes" \
    --trainer "$build/examples/mlp/zeroshard-train-mlp" --budget "$compare_limit" \
    --work-dir "$out/compare" --json "$out/compare.json" >"$out/compare.log" 2>&1
  compare_status=$?
  # The table, and what failed: each framework's line of it says why, its log says the rest.
  sed -n '/^[0-9]* rank(s) on/,$p' "$out/compare.log" | grep -v '^compare.py: ' >>"$report"
  if ((compare_status != 0)); then
    printf '\nfailed (exit %d); output in compare.log, each run'"'"'s log in compare/\n' \
      "$compare_status" >>"$report"
    failed=1
  fi
fi

# --- kernel benchmarks ----------------------------------------------------------------------
section "Kernel benchmarks"
if ! asked kernels; then
  :
elif ((build_failed != 0)) && [[ ! -x "$build/benchmarks/bench_kernels" ]]; then
  echo "not run: the build failed" >>"$report"
elif [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif fits 60; then
  # The fused AdamW against a device-to-device copy of the same bytes, with the ratio lines the
  # program prints.
  if logged bench-kernels.log "$build/benchmarks/bench_kernels" --benchmark_min_time=0.1; then
    printf '```\n%s\n```\n' "$(grep -vE '^(---|Run on|CPU Caches|  L[123]|Load Average)' \
      "$out/bench-kernels.log")" >>"$report"
  else
    failed=1
  fi
fi

# --- tests ----------------------------------------------------------------------------------
section "ctest -L gpu"
if ! asked tests; then
  :
elif ((build_failed != 0)); then
  echo "not run: the build failed" >>"$report"
elif [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif fits 60; then
  test_start=$(date +%s)
  # The stop time leaves the overlap benchmark its turn.
  tests_limit=$((tests_limit < $(left) - 90 ? tests_limit : $(left) - 90))
  # Cases not started by the stop time are reported as not run.
  ctest --test-dir "$build" -L gpu -j"$(($(nproc) / 2))" --timeout "$test_timeout" \
    --stop-time "$(date -d "+${tests_limit} sec" +%H:%M:%S)" --output-on-failure --output-junit "$out/ctest-junit.xml" >"$out/ctest.log" 2>&1 || failed=1
  python3 - "$out/ctest-junit.xml" >>"$report" <<'EOF'
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
rows, counts = [], {}
for case in cases:
    status = case.get("status", "run")
    if case.find("failure") is not None:
        status = "failed"
    elif case.find("skipped") is not None or status == "notrun":
        status = "skipped"
    else:
        status = "passed" if status == "run" else status
    counts[status] = counts.get(status, 0) + 1
    rows.append((case.get("name"), status, float(case.get("time", 0))))
print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + "\n")
print("| test | result | seconds |\n| --- | --- | --- |")
for name, status, seconds in rows:
    print(f"| {name} | {status} | {seconds:.1f} |")
EOF
  echo >>"$report"
  echo "$(($(date +%s) - test_start)) s; output in ctest.log" >>"$report"
fi

# --- the offloaded update during backward ----------------------------------------------------
section "Offloaded AdamW after backward vs during it (super_offload)"
if ! asked overlap; then
  :
elif ((build_failed != 0)) && [[ ! -x "$build/benchmarks/zeroshard-overlap-bench" ]]; then
  echo "not run: the build failed" >>"$report"
elif [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif fits 90; then
  # The model computes on the GPU and the update runs on the host, as ZeRO-Offload trains: the
  # two alternated, step by step, in one process.
  if logged super-offload.log timeout 90 "$build/benchmarks/zeroshard-overlap-bench" \
    --device cuda --super-offload --stages 23 --layers 8 --width 4096 --batch 64 --steps 6 \
    --warmup 2; then
    printf '```\n%s\n```\n' "$(cat "$out/super-offload.log")" >>"$report"
  else
    echo "failed or timed out; output in super-offload.log" >>"$report"
  fi
fi

# --- the libtorch adapter on the GPU ------------------------------------------------------------
section "libtorch: the torch GPT on the GPU, zeroshard against torch::optim"
gpt="$build/examples/torch/zeroshard-train-torch-gpt"
if ! asked torch; then
  :
elif [[ -n "$gpu_reason" ]]; then
  echo "skipped: $gpu_reason" >>"$report"
elif [[ ! -x "$gpt" ]]; then
  echo "not run: zeroshard-train-torch-gpt was not built (no usable libtorch; see Set-up)" \
    >>"$report"
elif fits 100; then
  # One loop, three optimizers: the same model, data and steps on one GPU; the torch GPT's
  # gpu-labelled tests ran above.
  echo "| optimizer | final loss (mean of the last 5 steps) | median step (ms) |" >>"$report"
  echo "| --- | --- | --- |" >>"$report"
  for variant in torch-optim zero0 zero3; do
    flags=(--config examples/configs/zero0.json --torch-optim)
    [[ $variant == zero* ]] && flags=(--config "examples/configs/$variant.json")
    if logged "torch-gpt-$variant.log" timeout 30 "$gpt" --device cuda "${flags[@]}" \
      --layers 8 --width 512 --heads 8 --seq-len 256 --batch 16 --steps 30 --lr 1e-3; then
      echo "| $variant | $(sed -n 's/^final loss.*: //p' "$out/torch-gpt-$variant.log") |" \
        "$(sed -n 's/^median step after the first: \([0-9.]*\) ms/\1/p' \
        "$out/torch-gpt-$variant.log") |" >>"$report"
    else
      failed=1
    fi
  done
fi

section "Summary"
echo "$( ((failed == 0)) && echo "nothing failed" || echo "FAILURES above"); $(elapsed) in all." \
  >>"$report"
cat "$report"
exit "$failed"

#!/usr/bin/env python3
"""zeroshard against DeepSpeed ZeRO-3 with offload_optimizer cpu (ratio 1 and a partial ratio)
and FSDP2 with CPUOffloadPolicy, on the MLP example's model, weights and data, on this machine.

Every framework trains the same steps in rounds, alternated (the order rotates each round), each
run a fresh launch: zeroshard-train-mlp under mpirun, the PyTorch peers (mlp_peer.py) under
torch.distributed.run. The table: median step time (the first step of each run left out), the
update's share of the step (the engine's step() call, or clip and optimizer.step()), device and
host peaks (the largest rank's), the first steps' losses, and zeroshard's figures over each
peer's. A framework that cannot run here (its module missing) is reported as skipped, by name.

Exit status 0 when every framework that ran finished and (with --check-losses) its first
losses agree with zeroshard's within --tolerance; 1 otherwise; a skip fails only with --strict.
"""

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from mlp_shape import parameter_count

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

FRAMEWORKS = ("zeroshard", "zeroshard-ratio", "deepspeed", "deepspeed-ratio", "fsdp2")
# zeroshard / peer rows of the table: the partial offloads are held against each other.
PAIRS = ((("zeroshard", "deepspeed"), ("zeroshard-ratio", "deepspeed-ratio"),
          ("zeroshard", "deepspeed-ratio"), ("zeroshard", "fsdp2")))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help="comma-separated, from: " + ", ".join(FRAMEWORKS))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        help="default: fp32 on the CPU, bf16 on a GPU")
    parser.add_argument("--ratio", type=float, default=0.5,
                        help="offload_optimizer.ratio of zeroshard-ratio and deepspeed-ratio: the "
                        "share of the optimizer updated on the host (the rest on the device); on "
                        "a GPU, the smallest share whose state fits")
    parser.add_argument("--trainer", default=os.path.join(ROOT, "build/examples/mlp/"
                                                          "zeroshard-train-mlp"))
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter with torch (and deepspeed) for the peers")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per run")
    parser.add_argument("--budget", type=int,
                        help="seconds for everything: a run that would start after them is "
                        "skipped and says so, a run still going at them is stopped")
    parser.add_argument("--check-losses", type=int, default=0, metavar="K",
                        help="fail when a peer's loss at any of the first K steps differs from "
                        "zeroshard's by more than --tolerance")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--strict", action="store_true", help="a skipped framework fails")
    parser.add_argument("--work-dir", help="configs, logs and records (default: a temporary "
                        "folder, removed unless a run failed)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    args.frameworks = args.frameworks.split(",")
    unknown = [f for f in args.frameworks if f not in FRAMEWORKS]
    if unknown:
        parser.error(f"unknown framework(s) {', '.join(unknown)}; known: {', '.join(FRAMEWORKS)}")
    if args.precision is None:
        args.precision = "bf16" if args.device == "cuda" else "fp32"
    if not 0 < args.ratio <= 1:
        parser.error(f"--ratio must be in (0, 1], got {args.ratio}")
    return args


def make_config(args, ratio):
    """One DeepSpeed-style config for zeroshard and DeepSpeed alike (FSDP2 reads its optimizer
    and clipping from it): the example's zero3_offload.json with the parameters on the device."""
    offload = {"device": "cpu", "pin_memory": args.device == "cuda"}
    zero = {"stage": 3, "offload_optimizer": offload}
    if ratio != 1:
        offload["ratio"] = ratio
        # DeepSpeed splits the optimizer between host and device by whole sub-groups, one by
        # default below 1e9 elements (which its ratio then puts on the host whole): 20 sub-groups
        # per rank make the split the ratio's to 0.05.
        parameters = parameter_count(args.inputs, args.width, args.layers, args.classes)
        zero["sub_group_size"] = max(1, -(-parameters // (args.ranks * 20)))
    return {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000000,
        "bf16": {"enabled": args.precision == "bf16"},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.999],
                                                  "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }


def missing_module(args, framework):
    """Why `framework` cannot run here, or None."""
    if framework.startswith("zeroshard"):
        if not os.access(args.trainer, os.X_OK):
            return f"{args.trainer} is not built"
        if shutil.which("mpirun") is None:
            return "mpirun is not on PATH"
        return None
    names = ["torch", "deepspeed"] if framework.startswith("deepspeed") else ["torch"]
    probe = ("import importlib.util\n"
             f"missing = [n for n in {names!r} if importlib.util.find_spec(n) is None]\n"
             f"if not missing and {framework == 'fsdp2'!r}:\n"
             "    import torch.distributed.fsdp as fsdp\n"
             "    if not hasattr(fsdp, 'CPUOffloadPolicy'):\n"
             "        missing = ['torch.distributed.fsdp.CPUOffloadPolicy (torch >= 2.6)']\n"
             "print(', '.join(missing))\n")
    try:
        result = subprocess.run([args.python, "-c", probe], capture_output=True, text=True,
                                timeout=120)
    except OSError as error:
        return f"{args.python}: {error}"
    if result.returncode != 0:
        return f"{args.python} could not look for {', '.join(names)}: {cause(result.stderr)}"
    missing = result.stdout.strip()
    return f"{missing} not found by {args.python}" if missing else None


def peer_env(args):
    env = dict(os.environ)
    # The same threads per rank for every framework: the cores shared out among the ranks.
    threads = str(max(1, (os.cpu_count() or 1) // args.ranks))
    env.setdefault("OMP_NUM_THREADS", threads)
    env.setdefault("OPENBLAS_NUM_THREADS", env["OMP_NUM_THREADS"])
    if args.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    for key in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"):
        env.setdefault(key, "1")
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    return env


def model_flags(args):
    return ["--inputs", str(args.inputs), "--width", str(args.width), "--layers",
            str(args.layers), "--classes", str(args.classes), "--seed", str(args.seed)]


STEP_LINE = re.compile(r"step +(\d+)/\d+ \| loss (\S+) .*\| +([\d.]+) ms/step \(step\(\) "
                       r"([\d.]+)\)")


def run_zeroshard(args, config_path, tag):
    report = os.path.join(args.work_dir, f"{tag}.report.json")
    command = ["mpirun", "-np", str(args.ranks), "--bind-to", "none", args.trainer, "--config",
               config_path, "--device", args.device, "--steps", str(args.steps),
               "--report-json", report, *model_flags(args)]
    output = launch(args, command, tag)
    steps = []
    for match in STEP_LINE.finditer(output):
        total, update = float(match[3]) / 1e3, float(match[4]) / 1e3
        steps.append({"loss": float(match[2]), "forward_backward_s": total - update,
                      "update_s": update})
    with open(report) as f:
        data = json.load(f)
    for step, loss in zip(steps, data["losses"]):
        step["loss"] = loss
    memory = data["memory"]
    return {"steps": steps,
            "host_peak_bytes": max(m["process_peak_rss"] for m in memory),
            "device_peak_bytes": (max(m["device"]["total_peak"] for m in memory)
                                  if args.device == "cuda" else None)}


def run_peer(args, framework, config_path, tag):
    record = os.path.join(args.work_dir, f"{tag}.json")
    command = [args.python, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={args.ranks}", os.path.join(HERE, "mlp_peer.py"),
               "--framework", framework.split("-")[0], "--config", config_path, "--device",
               args.device, "--steps", str(args.steps), "--out", record, *model_flags(args)]
    launch(args, command, tag)
    with open(record) as f:
        return json.load(f)


class RunFailed(Exception):
    pass


def seconds_left(args):
    return args.timeout if args.deadline is None else min(args.timeout,
                                                          int(args.deadline - time.monotonic()))


def launch(args, command, tag):
    log = os.path.join(args.work_dir, f"{tag}.log")
    timeout = seconds_left(args)
    # In a session of its own, so that a run out of time is stopped with its ranks: SIGTERM first,
    # which mpirun and torch.distributed.run pass on to them, then SIGKILL.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=peer_env(args), start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=max(timeout, 0))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        with open(log, "w") as f:
            f.write(stdout + stderr)
        raise RunFailed(f"timed out after {timeout} s (log {log})")
    with open(log, "w") as f:
        f.write(stdout + stderr)
    if process.returncode != 0:
        output = stdout + stderr
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise RunFailed(f"exit {process.returncode}: {cause(output)} (log {log})\nits end:\n{tail}")
    return stdout


def cause(output):
    """The line of a failed run's output that says why: the last error a rank raised or the
    trainer printed, past the launchers' own reports of it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines
              if re.search(r"(Error|Exception): |^zeroshard-train-mlp: |Killed|out of memory", line)
              and "ChildFailedError" not in line]
    return (errors or lines or ["no output"])[-1][:240]


def prepare_deepspeed(args, results):
    """Compiles DeepSpeedCPUAdam, and on the CPU accelerator the shared-memory collectives its
    init_distributed loads (JIT builds on first use), in one process before the runs: left to
    the ranks, every rank but one waits on a build's lock inside a collective, and the wait would
    be timed."""
    print("compare.py: building DeepSpeedCPUAdam for the DeepSpeed runs", file=sys.stderr,
          flush=True)
    build = ("from deepspeed.accelerator import get_accelerator\n"
             "get_accelerator().create_op_builder('CPUAdamBuilder').load()\n"
             "shm = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
             "if shm is not None:\n"
             "    shm.load()\n")
    try:
        launch(args, [args.python, "-c", build], "deepspeed-build")
    except RunFailed as error:
        for framework, result in results.items():
            if framework.startswith("deepspeed") and result["status"] == "ok":
                result["status"] = f"FAILED: building DeepSpeedCPUAdam: {error}"
        print(f"compare.py: building DeepSpeedCPUAdam FAILED: {error}", file=sys.stderr)


def summarize(runs):
    """Median step time, the update's share and the peaks over a framework's rounds."""
    timed = [s for run in runs for s in (run["steps"][1:] if len(run["steps"]) > 1
                                         else run["steps"])]
    totals = [s["forward_backward_s"] + s["update_s"] for s in timed]
    peaks = {}
    for key in ("host_peak_bytes", "device_peak_bytes"):
        values = [run[key] for run in runs if run.get(key) is not None]
        peaks[key] = max(values) if values else None
    return {"step_s": statistics.median(totals),
            "update_share": sum(s["update_s"] for s in timed) / sum(totals),
            "losses": [s["loss"] for s in runs[0]["steps"]], **peaks}


def label(args, framework):
    return {"zeroshard": "zeroshard, offload ratio 1",
            "zeroshard-ratio": f"zeroshard, offload ratio {args.ratio:g}",
            "deepspeed": "DeepSpeed ZeRO-3, offload ratio 1",
            "deepspeed-ratio": f"DeepSpeed ZeRO-3, offload ratio {args.ratio:g}",
            "fsdp2": "FSDP2 + CPUOffloadPolicy"}[framework]


def gib(value):
    return "-" if value is None else f"{value / 2**30:.3f} GiB"


def print_table(args, results, shown_losses):
    print(f"\n{args.ranks} rank(s) on {args.device}, {args.precision}, MLP {args.inputs}-"
          f"{args.layers}x{args.width}-{args.classes}, micro-batch {args.micro_batch}, "
          f"{args.steps} steps x {args.rounds} rounds alternated\n")
    header = ["framework", "ms/step (median)", "update share", "device peak", "host peak (RSS)"]
    header += [f"loss {i + 1}" for i in range(shown_losses)]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for framework, result in results.items():
        name = label(args, framework)
        if "summary" not in result:
            cells = [name, result["status"]] + [""] * (len(header) - 2)
        else:
            s = result["summary"]
            cells = [name, f"{s['step_s'] * 1e3:.2f}", f"{s['update_share']:.2f}",
                     gib(s["device_peak_bytes"]), gib(s["host_peak_bytes"])]
            cells += [f"{loss:.6f}" for loss in s["losses"][:shown_losses]]
        print("| " + " | ".join(cells) + " |")
    pairs = [(ours, theirs) for ours, theirs in PAIRS
             if "summary" in results.get(ours, {}) and "summary" in results.get(theirs, {})]
    if pairs:
        print("\n| zeroshard / peer | step time | device peak | host peak |")
        print("| --- | --- | --- | --- |")
        for ours, theirs in pairs:
            a, b = results[ours]["summary"], results[theirs]["summary"]
            cells = [f"{a['step_s'] / b['step_s']:.2f}"]
            for key in ("device_peak_bytes", "host_peak_bytes"):
                cells.append(f"{a[key] / b[key]:.2f}" if a[key] and b[key] else "-")
            print(f"| {label(args, ours)} / {label(args, theirs)} | " + " | ".join(cells) + " |")


def check_losses(args, results):
    """The peers' first losses against zeroshard's; returns the failures."""
    failures = []
    ours = results.get("zeroshard", {}).get("summary")
    if ours is None:
        return ["zeroshard did not run: no losses to hold the peers' against"]
    print(f"\nfirst {args.check_losses} losses against zeroshard's (tolerance "
          f"{args.tolerance:g}):")
    for framework, result in results.items():
        if framework == "zeroshard" or "summary" not in result:
            continue
        theirs = result["summary"]["losses"][:args.check_losses]
        worst = max(abs(a - b) for a, b in zip(theirs, ours["losses"]))
        verdict = "agree" if worst <= args.tolerance else "DISAGREE"
        print(f"  {label(args, framework)}: largest difference {worst:.3g}: {verdict}")
        if worst > args.tolerance:
            failures.append(f"{framework}: first losses differ from zeroshard's by {worst:.3g}")
    return failures


def main():
    args = parse_args()
    args.deadline = None if args.budget is None else time.monotonic() + args.budget
    keep = args.work_dir is not None
    args.work_dir = args.work_dir or tempfile.mkdtemp(prefix="compare_peers.")
    os.makedirs(args.work_dir, exist_ok=True)
    configs = {}
    for name, ratio in (("ratio1", 1.0), ("partial", args.ratio)):
        configs[name] = os.path.join(args.work_dir, f"config-{name}.json")
        with open(configs[name], "w") as f:
            json.dump(make_config(args, ratio), f, indent=2)

    results = {}
    for framework in args.frameworks:
        reason = missing_module(args, framework)
        results[framework] = {"status": f"skipped: {reason}" if reason else "ok", "runs": []}
        if reason:
            print(f"compare.py: {framework} SKIPPED: {reason}", file=sys.stderr)

    if any(f.startswith("deepspeed") and results[f]["status"] == "ok" for f in results):
        prepare_deepspeed(args, results)
    runnable = [f for f in args.frameworks if results[f]["status"] == "ok"]
    for round_index in range(args.rounds):
        order = runnable[round_index % len(runnable):] + runnable[:round_index % len(runnable)] \
            if runnable else []
        for framework in order:
            if results[framework]["status"] != "ok":
                continue
            if seconds_left(args) <= 0:
                # A framework with rounds behind it is summarized over those.
                if not results[framework]["runs"]:
                    results[framework]["status"] = f"skipped: the {args.budget} s budget ran out"
                print(f"compare.py: {framework}: round {round_index + 1} skipped: the "
                      f"{args.budget} s budget ran out", file=sys.stderr)
                continue
            tag = f"{framework}-round{round_index + 1}"
            config = configs["partial" if framework.endswith("-ratio") else "ratio1"]
            print(f"compare.py: round {round_index + 1}/{args.rounds}: {framework}",
                  file=sys.stderr, flush=True)
            try:
                run = (run_zeroshard(args, config, tag) if framework.startswith("zeroshard")
                       else run_peer(args, framework, config, tag))
                if len(run["steps"]) != args.steps:
                    raise RunFailed(f"reported {len(run['steps'])} of {args.steps} steps")
                results[framework]["runs"].append(run)
            except (RunFailed, OSError, ValueError, KeyError) as error:
                results[framework]["status"] = f"FAILED: {str(error).splitlines()[0]}"
                print(f"compare.py: {framework} FAILED: {error}", file=sys.stderr)
    for result in results.values():
        if result["status"] == "ok":
            result["summary"] = summarize(result["runs"])

    print_table(args, results, min(args.steps, max(3, args.check_losses)))
    failures = [f"{f}: {r['status']}" for f, r in results.items()
                if r["status"].startswith("FAILED")
                or (args.strict and r["status"].startswith("skipped"))]
    if args.check_losses:
        failures += check_losses(args, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results}, f,
                      indent=1)
    if failures:
        print("\ncompare.py: FAILED:\n  " + "\n  ".join(failures) + f"\n(logs in {args.work_dir})",
              file=sys.stderr)
        return 1
    if not keep:
        shutil.rmtree(args.work_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())

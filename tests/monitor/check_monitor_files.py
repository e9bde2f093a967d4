#!/usr/bin/env python3
"""Checks the csv_monitor and tensorboard files of a zeroshard-train-mlp run.

  check_monitor_files.py run OUT CONFIG -- MPIEXEC... PROGRAM ARGS...
      runs the program with CONFIG plus both monitors writing under OUT, keeps its stdout in
      OUT/stdout.txt and checks the CSV files: one row per step, the loss, lr and gradient norm
      equal to the step lines the program printed.
  check_monitor_files.py tensorboard OUT
      reads the same run's event files with TensorBoard's own EventAccumulator and checks that
      every scalar equals the CSV row of the same series and step. Exits 77 (skipped) when the
      tensorboard package cannot be imported.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

JOB = "mlp"
STEP_LINE = re.compile(
    r"^step\s+(\d+)/(\d+) \| loss (\S+) \| lr (\S+) \| grad norm (\S+) \|")


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def read_csv_folder(folder):
    """tag file name -> (header, [(x, value text)])"""
    series = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".csv"):
            continue
        with open(os.path.join(folder, name), newline="") as f:
            rows = list(csv.reader(f))
        series[name[:-4]] = (rows[0], [(int(x), v) for x, v in rows[1:]])
    return series


def printed_steps(out):
    with open(os.path.join(out, "stdout.txt")) as f:
        return [m.groups() for m in map(STEP_LINE.match, f) if m]


def run(out, config_path, command):
    with open(config_path) as f:
        config = json.load(f)
    for key in ("csv_monitor", "tensorboard"):
        config[key] = {"enabled": True, "output_path": out, "job_name": JOB}
    # A new run adds an event file beside an old run's: start from an empty folder.
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    monitored = os.path.join(out, "config.json")
    with open(monitored, "w") as f:
        json.dump(config, f)
    result = subprocess.run(command + ["--config", monitored], capture_output=True, text=True)
    with open(os.path.join(out, "stdout.txt"), "w") as f:
        f.write(result.stdout)
    if result.returncode != 0:
        fail("the run failed:\n" + result.stdout + result.stderr)

    steps = printed_steps(out)
    if not steps:
        fail("the run printed no step lines")
    total = int(steps[0][1])
    world = int(re.search(r"-np\s+(\d+)", " ".join(command)).group(1))
    batch = config["train_micro_batch_size_per_gpu"] * config.get("gradient_accumulation_steps",
                                                                     1) * world
    series = read_csv_folder(os.path.join(out, JOB))
    for name, (header, rows) in series.items():
        if header[0] != "step" or len(header) != 2:
            fail(f"{name}.csv: header {header}")
        if len(rows) != total:
            fail(f"{name}.csv: {len(rows)} rows for {total} steps")
        xs = [x for x, _ in rows]
        if xs != sorted(set(xs)):
            fail(f"{name}.csv: x not increasing: {xs}")
    for rank in range(world):
        if not any(n.startswith(f"Memory_rank{rank}_host_") for n in series):
            fail(f"no memory series of rank {rank}")

    def column(name):
        return dict(series[name][1])

    loss, lr = column("Train_Samples_train_loss"), column("Train_Samples_lr")
    norm = column("Train_Step_grad_norm")
    for step, _, printed_loss, printed_lr, printed_norm in steps:
        step = int(step)
        samples = step * batch
        checks = [("train_loss", "%.6f" % float(loss[samples]), printed_loss),
                  ("lr", "%.3e" % float(lr[samples]), printed_lr),
                  ("grad_norm", "%.4f" % float(norm[step]), printed_norm)]
        for what, written, shown in checks:
            if written != shown:
                fail(f"step {step}: {what} written {written}, printed {shown}")
    print(f"{len(series)} CSV series of {total} rows each; loss, lr and grad norm equal the "
          f"{len(steps)} printed step lines")


def tensorboard(out):
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as error:
        print(f"SKIP: the tensorboard package cannot be imported ({error}); "
              "pip install tensorboard")
        sys.exit(77)
    import struct

    def as_float32(text):
        return struct.unpack("f", struct.pack("f", float(text)))[0]

    job = os.path.join(out, JOB)
    series = read_csv_folder(job)
    runs = [job] + [os.path.join(job, d) for d in sorted(os.listdir(job))
                    if d.startswith("rank") and os.path.isdir(os.path.join(job, d))]
    if len(runs) < 2:
        fail("no tensorboard run of the second rank")
    compared = 0
    tags = set()
    for folder in runs:
        accumulator = event_accumulator.EventAccumulator(
            folder, size_guidance={event_accumulator.SCALARS: 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            tags.add(tag)
            name = tag.replace("/", "_").replace(" ", "_")
            if name not in series:
                fail(f"tensorboard tag {tag} has no CSV file")
            rows = series[name][1]
            events = accumulator.Scalars(tag)
            if [e.step for e in events] != [x for x, _ in rows]:
                fail(f"{tag}: steps {[e.step for e in events]} against CSV {[x for x, _ in rows]}")
            for event, (x, value) in zip(events, rows):
                if event.value != as_float32(value):
                    fail(f"{tag} at {x}: tensorboard {event.value}, CSV {value}")
                compared += 1
    missing = set(series) - {t.replace("/", "_") for t in tags}
    if missing:
        fail(f"CSV series without a tensorboard tag: {sorted(missing)}")
    print(f"TensorBoard's EventAccumulator read {len(tags)} tags in {len(runs)} runs; "
          f"{compared} scalars equal the CSV rows")


def main():
    if len(sys.argv) >= 6 and sys.argv[1] == "run" and sys.argv[4] == "--":
        run(os.path.abspath(sys.argv[2]), sys.argv[3], sys.argv[5:])
    elif len(sys.argv) == 3 and sys.argv[1] == "tensorboard":
        tensorboard(os.path.abspath(sys.argv[2]))
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()

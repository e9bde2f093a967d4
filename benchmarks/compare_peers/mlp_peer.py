"""One rank of the MLP example trained by a PyTorch peer of zeroshard: DeepSpeed ZeRO-3 with its
optimizer offloaded to the CPU, or FSDP2 (fully_shard) with CPUOffloadPolicy. Started by
torch.distributed.run (compare.py does it); rank 0 writes a JSON record of the run.

Each step times forward + loss + backward and then the update call (DeepSpeed's engine.step();
FSDP2's clip_grad_norm_ and optimizer.step()), after synchronizing the device at each boundary.
"""

import argparse
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlp_task  # noqa: E402
from mlp_shape import layer_shapes, parameter_count  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--framework", required=True, choices=["deepspeed", "fsdp2"])
    parser.add_argument("--config", required=True,
                        help="the DeepSpeed-style config JSON zeroshard trains from too")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="JSON record, written by rank 0")
    return parser.parse_args()


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_deepspeed(args, config, device):
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    # zero.Init partitions each layer as it is built, in the config's precision on the device,
    # instead of the whole fp32 model being built on the host first.
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = mlp_task.Mlp(args.inputs, args.width, args.layers, args.classes)
    shapes = layer_shapes(args.inputs, args.width, args.layers, args.classes)
    for layer, (weight, bias) in zip(model.layers,
                                     mlp_task.initial_values(args.seed, shapes, device)):
        # Rank 0's values go into every rank's partition as the context ends.
        with deepspeed.zero.GatheredParameters([layer.weight, layer.bias], modifier_rank=0):
            with torch.no_grad():
                if dist.get_rank() == 0:
                    layer.weight.copy_(weight)
                    layer.bias.copy_(bias)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)

    def train_step(x, labels):
        synchronize(device)
        start = time.perf_counter()
        logits = engine(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        engine.backward(loss)
        synchronize(device)
        middle = time.perf_counter()
        engine.step()
        synchronize(device)
        return loss.detach(), middle - start, time.perf_counter() - middle

    # What ran the update, for the record: DeepSpeedCPUAdam on the host's share.
    optimizer = type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__
    return train_step, next(engine.module.parameters()).dtype, optimizer


def build_fsdp2(args, config, device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    # Gloo beside NCCL: with the gradients on the host, clip_grad_norm_ sums host tensors.
    dist.init_process_group("cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    # Built on the meta device and sharded before any memory is allocated: to_empty then gives
    # the host this rank's fp32 shards only, never the whole model beside them.
    with torch.device("meta"):
        model = mlp_task.Mlp(args.inputs, args.width, args.layers, args.classes)
    bf16 = config.get("bf16", {}).get("enabled", False)
    policy = dict(
        mesh=mesh,
        # Pinned host memory is what makes the copies asynchronous on a GPU; there is no device
        # to pin for on a CPU-only box.
        offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda"),
        mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else torch.float32,
                                       reduce_dtype=torch.float32))
    for layer in model.layers:
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    model.to_empty(device="cpu")
    shapes = layer_shapes(args.inputs, args.width, args.layers, args.classes)
    with torch.no_grad():
        # Drawn on the device (the generator's integer passes are slow on a host's cores at the
        # 7B-class size) and copied into the host shards.
        for layer, values in zip(model.layers,
                                 mlp_task.initial_values(args.seed, shapes, device)):
            for param, full in zip((layer.weight, layer.bias), values):
                # FSDP2 shards dim 0 as torch.chunk does; the last ranks' chunks may be empty.
                chunks = torch.chunk(full, world, dim=0)
                if rank < len(chunks):
                    param.to_local().copy_(chunks[rank])
    params = config["optimizer"]["params"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=params["lr"],
                                  betas=tuple(params["betas"]), eps=params["eps"],
                                  weight_decay=params["weight_decay"])
    clip = config.get("gradient_clipping", 0.0)

    def train_step(x, labels):
        synchronize(device)
        start = time.perf_counter()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        loss.backward()
        synchronize(device)
        middle = time.perf_counter()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        return loss.detach(), middle - start, time.perf_counter() - middle

    # The policy casts the fp32 input to its param_dtype.
    return train_step, torch.float32, type(optimizer).__name__


def main():
    args = parse_args()
    with open(args.config) as f:
        config = json.load(f)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    build = build_deepspeed if args.framework == "deepspeed" else build_fsdp2
    train_step, compute_dtype, optimizer = build(args, config, device)
    rank, world = dist.get_rank(), dist.get_world_size()
    # The device peak from the first step on, as zeroshard-train-mlp resets its report's peaks.
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    micro_batch = config["train_micro_batch_size_per_gpu"]
    data = mlp_task.SyntheticData(args.inputs, args.classes, args.seed)
    steps = []
    for step in range(args.steps):
        x, labels = data.sample(mlp_task.data_parallel_first(step, micro_batch, rank, world),
                                micro_batch)
        loss, forward_backward, update = train_step(x.to(device, compute_dtype),
                                                    labels.to(device))
        # The mean of the ranks' means is the global batch's mean: every micro-batch is the same
        # size, as zeroshard-train-mlp reports it.
        total = loss.float().reshape(1).clone()
        dist.all_reduce(total)
        steps.append({"loss": total.item() / world, "forward_backward_s": forward_backward,
                      "update_s": update})

    # ru_maxrss is KiB on Linux.
    peaks = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                          torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0],
                         dtype=torch.int64, device=device)
    dist.all_reduce(peaks, op=dist.ReduceOp.MAX)
    if rank == 0:
        record = {"framework": args.framework, "world": world, "device": str(device),
                  "parameters": parameter_count(args.inputs, args.width, args.layers,
                                                args.classes),
                  "steps": steps, "backend": dist.get_backend(), "optimizer": optimizer,
                  "host_peak_bytes": int(peaks[0]),
                  "device_peak_bytes": int(peaks[1]) if device.type == "cuda" else None,
                  "torch": torch.__version__}
        if args.framework == "deepspeed":
            import deepspeed
            record["deepspeed"] = deepspeed.__version__
        with open(args.out, "w") as f:
            json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Past this point the run is complete and recorded. Gloo's threads can still hold work whose
    # tensors reach into Python, and the interpreter's finalization then aborts the process now and
    # then ("terminate called without an active exception", pytorch/pytorch#179291): leave
    # without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""The MLP example's model, initial weights and data in PyTorch, value for value.

zeroshard-train-mlp draws its weights from splitmix64 (examples/mlp/mlp_model.cpp,
examples/common/model_init.h) and its samples from seeded Gaussian clusters
(examples/mlp/synthetic_data.cpp); this module repeats both draws, so a PyTorch framework trains
the same model from the same weights on the same samples and its first losses can be held
against zeroshard's.
"""

import math

import numpy as np
import torch

from mlp_shape import layer_shapes

GOLDEN = 0x9E3779B97F4A7C15
MUL1 = 0xBF58476D1CE4E5B9
MUL2 = 0x94D049BB133111EB
CENTRES_SALT = 0x63656E74726573
CENTRE_SPREAD = 0.5
MASK64 = (1 << 64) - 1


def _signed(value):
    """A uint64 constant as the int64 with the same bits (torch has no uint64 arithmetic)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _srl(z, bits):
    """Logical right shift of int64 tensors holding uint64 bits."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _finalize_torch(z):
    z = (z ^ _srl(z, 30)) * _signed(MUL1)
    z = (z ^ _srl(z, 27)) * _signed(MUL2)
    return z ^ _srl(z, 31)


def _finalize_np(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MUL1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MUL2)
    return z ^ (z >> np.uint64(31))


def _mix(value):
    """synthetic_data.cpp's mix() of one Python int."""
    z = (value + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MUL1) & MASK64
    z = ((z ^ (z >> 27)) * MUL2) & MASK64
    return z ^ (z >> 31)


class Mlp(torch.nn.Module):
    """fc0..fc{layers-1} with ReLU between them, as MlpModel registers them."""

    def __init__(self, inputs, width, layers, classes, device=None, dtype=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Linear(i, o, device=device, dtype=dtype)
            for i, o in layer_shapes(inputs, width, layers, classes))

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index != len(self.layers) - 1:
                x = torch.relu(x)
        return x


def _uniform(seed, counter, count, bound, device, chunk=1 << 24):
    """fill_uniform's `count` values from splitmix64 draws counter+1 .. counter+count of `seed`
    (draw j finalizes seed + j * GOLDEN), in fp32."""
    out = torch.empty(count, dtype=torch.float32, device=device)
    for first in range(0, count, chunk):
        n = min(chunk, count - first)
        draws = torch.arange(counter + first + 1, counter + first + n + 1, dtype=torch.int64,
                             device=device)
        z = _finalize_torch(draws * _signed(GOLDEN) + _signed(seed & MASK64))
        unit = _srl(z, 40).to(torch.float32) * (2.0 ** -24)
        out[first:first + n] = (2.0 * unit - 1.0) * bound
    return out


def initial_values(seed, shapes, device):
    """Yields (weight [out, in], bias [out]) of each layer as MlpModel::initialize sets them."""
    counter = 0
    for fan_in, fan_out in shapes:
        bound = float(np.float32(1.0) / np.sqrt(np.float32(fan_in)))
        weight = _uniform(seed, counter, fan_in * fan_out, bound, device).view(fan_out, fan_in)
        counter += fan_in * fan_out
        bias = _uniform(seed, counter, fan_out, bound, device)
        counter += fan_out
        yield weight, bias


def _units(z):
    return ((z >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53


def _normals(first_draws, count):
    """`count` Box-Muller normals of each generator whose draw 0 is first_draws[i] (mixed state),
    from its draws 1, 2, 3, ... (draw 0 is the label)."""
    offsets = np.arange(1, 2 * count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        states = first_draws[:, None] + offsets[None, :]
    units = _units(_finalize_np(states + np.uint64(GOLDEN)))
    radius = np.sqrt(-2.0 * np.log(units[:, 0::2]))
    return radius * np.cos(2.0 * math.pi * units[:, 1::2])


class SyntheticData:
    """SyntheticClassification: sample i of the stream depends on the seed and i only."""

    def __init__(self, inputs, classes, seed):
        self.inputs, self.classes, self.seed = inputs, classes, seed
        state = np.array([_mix(_mix(seed ^ CENTRES_SALT))], dtype=np.uint64)
        # The centres' generator starts at draw 0, so its draws are state + 0, 1, 2, ...
        offsets = np.arange(0, 2 * classes * inputs, dtype=np.uint64)
        with np.errstate(over="ignore"):
            units = _units(_finalize_np(state + offsets + np.uint64(GOLDEN)))
        normals = np.sqrt(-2.0 * np.log(units[0::2])) * np.cos(2.0 * math.pi * units[1::2])
        self.centres = (CENTRE_SPREAD * normals).astype(np.float32).reshape(classes, inputs)

    def sample(self, first, count):
        """Samples [first, first + count): x [count, inputs] fp32 and labels [count] int64."""
        mixed_seed = _mix(self.seed)
        states = np.array([_mix(mixed_seed ^ (first + i)) for i in range(count)], dtype=np.uint64)
        labels = (_finalize_np(states + np.uint64(GOLDEN)) % np.uint64(self.classes)).astype(
            np.int64)
        x = self.centres[labels] + _normals(states, self.inputs).astype(np.float32)
        return torch.from_numpy(x), torch.from_numpy(labels)


def data_parallel_first(step, micro_batch, rank, world):
    """data_parallel_range's first sample, one micro-step per step."""
    return step * micro_batch * world + rank * micro_batch

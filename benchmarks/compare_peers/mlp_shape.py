"""The MLP example's layer shapes (MlpModel), without the PyTorch the rest of the peers need."""


def layer_shapes(inputs, width, layers, classes):
    """(in, out) of each linear layer, fc0 first."""
    return [(inputs if i == 0 else width, classes if i == layers - 1 else width)
            for i in range(layers)]


def parameter_count(inputs, width, layers, classes):
    return sum(i * o + o for i, o in layer_shapes(inputs, width, layers, classes))

"""The parts of `train launch` (train.node.launch), one module per concern; like it they run
from the bound copy in an image without `train`: the standard library only, Python >= 3.9."""

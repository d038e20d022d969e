"""The parts of `train launch` (train.node.launch), which runs inside the container on every
node of a job step: the step and its rendezvous (step), DataLoader worker sizing (sizing),
the wait for free GPU memory (gpumem), the scontrol stand-in (shim), torch's launcher and
its workers (torchrun), the checks and environment before the program starts (environment)
and the node's GPU sampler (watch). Like train.node.launch they run from the bound copy in an
image without `train` (train.node.nodeentry): the standard library only, Python >= 3.9."""

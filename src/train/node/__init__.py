"""Inside the container on every node of a job step: `train launch` and its parts, stop
signals, the GPU watch's sampler. Runs from a bound copy on Python >= 3.9 with the standard
library alone where the image has no `train` (tests/unit/test_nodeentry.py)."""

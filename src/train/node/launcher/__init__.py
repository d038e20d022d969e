"""The parts of `train launch`: environment (set up before the program) and step (the job
step, each mode's launch); like it, standard library only, Python >= 3.9 (the bound copy)."""

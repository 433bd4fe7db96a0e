import os

# OpenMP's default busy-waiting makes torch ~10x slower when the 2 cores are shared with other
# processes (measured: 14.9 s vs 1.5 s per demo training step). Must be set before torch loads.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

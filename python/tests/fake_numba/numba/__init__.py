"""A stand-in for Numba in tests where Numba is not installed: only what an
External Memory Management plug-in touches, with the behaviour Numba's EMM
documentation and numba-cuda's driver give it (see numba/cuda/cudadrv/driver.py
here). Put this directory first on sys.path to use it."""
FAKE = True

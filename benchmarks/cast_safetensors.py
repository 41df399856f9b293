"""Cast a safetensors file's floating-point tensors to another dtype in place, keeping its metadata.

    python benchmarks/cast_safetensors.py FILE float16    # to carry MiniLM to a GPU machine in half the bytes
    python benchmarks/cast_safetensors.py FILE float32    # there, back to the dtype transformers loads it in

Used by experiments/imdb/gpu_grid.sh.
"""

import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

path, dtype = sys.argv[1], getattr(torch, sys.argv[2])
with safe_open(path, "pt") as f:
    meta = f.metadata()
save_file({k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(path).items()}, path, metadata=meta)

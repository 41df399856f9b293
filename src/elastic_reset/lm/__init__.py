"""Language-model primitives shared by the RL engine and the evaluation: teacher-forced scoring and the
CPU bf16 kernels. Imports nothing else from the package."""

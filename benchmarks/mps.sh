# Sourced by the GPU-lease scripts (gpu_imdb_grid.sh, gpu_translation.sh) before several cells share one GPU.
#   start_mps   starts CUDA MPS, which lets the cells' processes run kernels side by side instead of time-slicing
#               the GPU between their contexts; sets mps=on, or mps=off (and leaves MPS's variables unset) where
#               it does not start or a CUDA context then fails
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  if nvidia-cuda-mps-control -d \
    && timeout 30 python3 -c "import torch; print(torch.ones(2, device='cuda').sum().item())"; then
    mps=on
  else
    echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; mps=off
  fi
}

"""The runs of a lent machine with a GPU (device.sh) and the GPU benchmark (gpu.py)."""

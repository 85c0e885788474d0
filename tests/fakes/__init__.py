"""Fakes of the accelerator tools: NVML at the pynvml boundary, an hl-smi executable."""

"""Performance models: FLOPs, CPU GEMM rate, measured calibration."""

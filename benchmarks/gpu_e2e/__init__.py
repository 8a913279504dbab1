"""`make gpu-e2e`: the whole DAG as users run it (`flashdraft run-local`: the runner, kfp.local, each stage's task,
checkpoints, a preemption and resume, export, report) on one CUDA GPU, measured, and the measured rates written as a
calibration file `flashdraft plan --calibrate` reads. `make gpu-e2e-dry` runs the same script on CPU at tiny shapes
(tests/integration/test_gpu_e2e_dry.py runs it in CI), so the GPU call is never the first time this code runs.

Modules: `env` (what a bare GPU machine lacks, from the carried wheels; one line when something is missing),
`runs` (the two runs and their settings in each mode), `measure` (memory sampling, the stage table, the
calibration file), `cli` (the command). Run it as `python3 benchmarks/gpu_e2e [--dry] [--out DIR]`.
"""

"""The simulator: the engine's pure KV core on a virtual clock, timed by a roofline cost model.

Map: `geometry` reads HF-style config.json files (`models/*.json`, shipped) into KV bytes/token, FLOPs/token
and weight bytes (dense, MoE, MLA); `hardware` holds device and link profiles as data plus the calibration
hook (`calibrate` with a `StepProbe`); `cost` times engine steps, transfers and pipelined restores;
`capacity` is the planner behind `kvbench capacity`; `presets` names the compared systems (vllm-prefix,
sglang-radix, lmcache-local, lmcache-shared); `lower_tiers` keeps LMCache-style host/disk/remote copies on
the core's prefix index; `node` is the one module that drives the core (schedule -> cost -> postprocess);
`engine` is the discrete-event loop and client (`simulate`); `run_folder` writes the same run folder as a
real run.
"""

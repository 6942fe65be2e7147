"""The simulator: the engine's pure KV core on a virtual clock, timed by a roofline cost model.

Map: `geometry` reads HF-style config.json files (`models/*.json`, shipped) into KV bytes/token, FLOPs/token
and weight bytes (dense, MoE, MLA); `hardware` holds device and link profiles as data; `calibrate` fits a
profile's efficiencies to measured engine steps; `cost` times engine steps, transfers and pipelined restores;
`capacity` is the arithmetic behind `kvbench capacity`; `plan` searches the fewest nodes that meet an SLO
(`kvbench plan`) and `plan_report` writes its files; `presets` names the compared systems (vllm-prefix,
sglang-radix, lmcache-local, lmcache-shared, kvengine-tiers); `lower_tiers` keeps LMCache-style
host/disk/remote copies on the core's prefix index and defines the seam a node drives its lower tiers through;
`ttl_tiers` runs our engine's TierPolicy behind that seam; `node` is the one module that drives the core
(schedule -> cost -> postprocess); `engine` is the discrete-event loop and client (`simulate`); `validate`
replays a real run of our engine; `run_folder` writes the same run folder as a real run.
"""

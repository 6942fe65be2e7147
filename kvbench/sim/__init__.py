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
`config` is what a simulation simulates (SimConfig) and `vllm_memory` vLLM's KV memory arithmetic; `routing` picks
a fleet's node per request (round-robin, sticky, least-loaded, SGLang's cache-aware, llm-d's precise-prefix);
`staged` plays a ladder of load stages on one fleet; `published` reads a published GPU experiment's case file
and compares it stage by stage (`published_report` writes and checks the comparison), `calibrate_published`
fits the device speeds to part of one; `plan_floor` is the SLO floor at unbounded nodes `kvbench plan` checks first.
"""

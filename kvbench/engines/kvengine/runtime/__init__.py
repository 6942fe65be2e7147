"""The runtime of kvengine: what carries out the pure core's decisions on a real model and real bytes.

`engine.Engine` is the step loop (schedule -> run the model -> postprocess), synchronous and single-threaded;
`async_engine.AsyncEngine` runs it on a thread of its own for the HTTP server; `offload.OffloadExecutor`
moves KV between the device and the lower tiers (`tier_stores`: host, disk, Redis) where `core.tiers`
decides, built from the engine's settings by `offload_setup.executor_for`; `requests` is what the runtime is asked for and answers (and `RequestLimits`, which the server
checks each request against);
`metrics` exports Prometheus text; `step_probe` logs and probes step times for calibration; `model_runner` is a
rank's model and KV pages and the device ops rank 0 sends every rank (tensor parallel); `memory_budget` sizes
weights, KV and activations per device before anything is allocated.

Imports the core, the model and the settings; never the server or the adapter.
"""

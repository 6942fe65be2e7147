"""The real run: experiment config, the load generator and its HTTP client (one SSE parser for every
endpoint), the runner that starts engines and writes the run folder, reconciliation with server counters,
the instrument server (what judges a run is kvbench.verdicts). Imports `measure`, `workloads` and the adapter contract in
`engines`; never the engine's core, model or runtime, never the CLI, the simulator, the evals or the verdicts.
"""

"""Our engine's settings, on a floor of their own below the server, the runtime and the adapter: `config`
(every engine setting, defined once), `flags` (the `kvbench serve` flags and a child's argv, derived from it),
`openmp` (how the engine's OpenMP threads wait; imports only os, since it runs before torch loads) and `tenants`
(the tenants file's parser). Torch-free: imports the pure core and kvbench.settings only, so the simulator and
the CLI read the engine's settings without reaching into its runtime."""

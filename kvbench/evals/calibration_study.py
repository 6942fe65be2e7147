"""How the static FP8 scales' calibration changes divergence: margin and calibration text, measured.

    python -m kvbench.evals.calibration_study [--tokens 1024] [--window 1024] [--margins 1,2] > table.md

For each FP8 setting: KL and top-1 agreement against fp32 KV on the Britannica corpus, with scales from the
engine's fixed calibration text or from the scored window itself (an oracle), at each margin.
"""

from __future__ import annotations

import argparse
import time

from kvbench.engines.kvengine.core.kv_format import DEFAULT_SCALE_MODE, SCALE_MODES, KVDtype
from kvbench.evals.divergence import EMPTY
from kvbench.evals.inprocess import Calibration, divergence_pass, windows
from kvbench.evals.kv_settings import kv_settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--margins", default="1,2")
    parser.add_argument("--sources", default="engine,window")
    args = parser.parse_args()
    import torch

    from kvbench.engines.kvengine.model.loader import load_model
    from kvbench.evals.tasks import corpus_text

    torch.set_num_threads(2)
    loaded = load_model(args.model)
    ids = list(loaded.tokenizer(corpus_text())["input_ids"])
    token_windows = windows(ids, args.window, args.tokens)
    fp8 = [KVDtype.FP8_E4M3.value, KVDtype.FP8_E5M2.value]
    settings = [s for s in kv_settings([KVDtype.FP32.value, *fp8], SCALE_MODES) if s.quantized]
    baseline = kv_settings([KVDtype.FP32.value], [DEFAULT_SCALE_MODE.value])[0]
    print(
        f"model {args.model}, {sum(len(w) - 1 for w in token_windows)} scored positions in windows of {args.window}\n"
    )
    print("| calibration | margin | kv setting | KL (nats) | top-1 agreement | perplexity delta |")
    print("|---|---|---|---|---|---|")
    for source in args.sources.split(","):
        for margin in (float(m) for m in args.margins.split(",")):
            started = time.monotonic()
            stats = divergence_pass(loaded, baseline, settings, token_windows, Calibration(source, margin))
            for setting in settings:
                s = stats.get(setting.label, EMPTY)
                print(
                    f"| {source} | {margin:g} | {setting.label} | {s.kl:.2e} | {100 * s.top1_agreement:.1f}% | "
                    f"{100 * s.perplexity_delta:+.2f}% |",
                    flush=True,
                )
            print(f"<!-- {source} margin {margin:g}: {time.monotonic() - started:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()

"""One step's model run, isolating a request whose computation fails: it fails alone, the others' step completes."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvbench.engines.kvengine.core.scheduler import RequestId, ScheduledSeq
from kvbench.engines.kvengine.runtime.model_runner import is_device_error
from kvbench.engines.kvengine.runtime.requests import StepOutput

log = logging.getLogger("kvbench.engines.kvengine.runtime.engine")  # its messages keep the engine's logger


def run_isolating(
    run: Callable[[tuple[ScheduledSeq, ...]], tuple[dict[RequestId, int], list[StepOutput]]],
    seqs: tuple[ScheduledSeq, ...],
) -> tuple[dict[RequestId, int], list[StepOutput], dict[RequestId, str]]:
    """Run the batch; if that raises, run each sequence alone, so that a request whose computation fails
    (its logits, its sampling) fails alone and the others' step completes. Returns the sampled tokens,
    the outputs and, per failed request, why. Nothing of a failed batch is kept but prompt logprobs, which
    a rerun of the same chunk does not append twice; a seeded neighbour may draw a different token than
    it would have. A device error (torch.AcceleratorError: the device is unusable for every request) is
    not a request's fault: it propagates, and the caller treats it as fatal."""
    try:
        sampled, outputs = run(seqs)
        return sampled, outputs, {}
    except Exception as exc:
        if is_device_error(exc):
            raise
        if len(seqs) == 1:
            return {}, [], {seqs[0].request_id: describe(exc)}
        log.warning("a step of %d sequences failed (%s); running each alone", len(seqs), describe(exc))
    sampled, outputs, failed = {}, [], {}
    for item in seqs:
        try:
            one_sampled, one_outputs = run((item,))
        except Exception as exc:
            if is_device_error(exc):
                raise
            failed[item.request_id] = describe(exc)
            continue
        sampled.update(one_sampled)
        outputs.extend(one_outputs)
    return sampled, outputs, failed


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"

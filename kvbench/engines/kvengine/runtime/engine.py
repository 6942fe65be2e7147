"""The engine step loop: schedule -> run the model -> postprocess, on the pure core's decisions.

    plan = scheduler.schedule(now)                 # which tokens of which requests, in which pages
    logits = model(ForwardBatch(plan), kv_cache)   # K/V written into those pages, attention read from them
    finished = scheduler.postprocess(plan, sampled, now)

Lower KV tiers (host, disk, a shared Redis) belong to the `OffloadExecutor`, which the step calls before
scheduling (finished restores join the scheduler; idle pages move down) and after (evicted pages are copied
down before their ids are reused; new pages are published to the shared tier). Time comes from `clock`
(default `time.monotonic`), so tests can run TTLs of minutes in an instant.

The engine is synchronous and single-threaded; `AsyncEngine` runs it on a thread of its own so that the
HTTP event loop never waits on model compute.

Tensor parallel: this engine is rank 0. It alone schedules; every op of device work (a forward, a swap) goes
to the other ranks first (`Ranks.send`, see `model_runner`) and then runs here, so every rank executes the
same plan on its own shard. Lower tiers need one rank (`server/ranks.py` refuses them with more).

Failures: a model run that raises for one request fails that request alone (its client gets the error, its
pages are released, the rest of the step completes; see `isolation.run_isolating`). Anything else that `step` raises
(the scheduler, the tiers, a device error) is the engine's own: the engine is broken and its caller stops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from kvbench.engines.kvengine.core.events import CacheEvent, EventLog, PageJournal
from kvbench.engines.kvengine.core.namespaces import TenantId, shared_tokens_of
from kvbench.engines.kvengine.core.pages import PagePool
from kvbench.engines.kvengine.core.prefix_index import DEVICE_TIER, PrefixIndex
from kvbench.engines.kvengine.core.scheduler import (
    FinishedRequest,
    Request,
    RequestId,
    ScheduledSeq,
    Scheduler,
    SchedulerConfig,
)
from kvbench.engines.kvengine.core.tenants import TenantLedger
from kvbench.engines.kvengine.model.batch import SequenceChunk
from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.engines.kvengine.model.sampling import sample, token_logprobs
from kvbench.engines.kvengine.runtime.isolation import run_isolating
from kvbench.engines.kvengine.runtime.memory_budget import fit_memory, free_device_bytes
from kvbench.engines.kvengine.runtime.metrics import EngineMetrics
from kvbench.engines.kvengine.runtime.model_runner import (  # noqa: F401 - TINY_RANDOM: evals import it here
    TINY_RANDOM,
    TORCH_COMPUTE_DTYPES,
    DeviceOp,
    DropSwap,
    Forward,
    ForwardResult,
    Ranks,
    SwapIn,
    SwapOut,
    build_runner,
    chunks_of,
    load_rank_model,
    model_config_of,
    model_digest,
    rank_device,
)
from kvbench.engines.kvengine.runtime.offload import Admission
from kvbench.engines.kvengine.runtime.offload_setup import executor_for
from kvbench.engines.kvengine.runtime.prefill_budget import PrefillBudget
from kvbench.engines.kvengine.runtime.requests import (
    GenerationRequest,
    LiveRequest,
    RequestLimits,
    StepOutput,
    TokenLogprob,
)
from kvbench.engines.kvengine.runtime.shared_prefixes import declared_prefixes
from kvbench.engines.kvengine.settings.config import AUTO, EngineConfig, IsolationMode
from kvbench.engines.kvengine.settings.tenants import TenantsConfig, load_tenants
from kvbench.settings import SettingsError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One model step as it ran: the token range [start, end) each sequence computed, and the step's wall
    seconds from scheduling to the last gauge update (what a cost model's step time stands for)."""

    work: tuple[tuple[int, int], ...]
    seconds: float


class Engine:
    """A model, its paged KV cache and the core's scheduler. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        config: EngineConfig,
        loaded: LoadedModel | None = None,
        clock: Callable[[], float] = time.monotonic,
        ranks: Ranks = Ranks(),
    ) -> None:
        self.device = rank_device(config.device, ranks.parallel.rank)
        # `kvbench serve` resolves auto before anything starts; a caller that did not gets it here (with `loaded`
        # given, its weights already hold memory and count once more: a conservative capacity)
        if config.kv_capacity == AUTO:
            model_config = loaded.config if loaded is not None else model_config_of(config)
            config, _ = fit_memory(model_config, config, free_device_bytes(self.device))
        self.config = config
        self.clock = clock
        self.ranks = ranks
        dtype = TORCH_COMPUTE_DTYPES[config.compute_dtype]
        self.loaded = loaded or load_rank_model(config, ranks.parallel)
        self.model = self.loaded.model
        model_config = self.loaded.config
        self.max_model_len = config.max_model_len or model_config.max_position_embeddings
        self.model_name = config.served_model_name or self.loaded.folder.name
        self.runner = build_runner(config, self.loaded, dtype, self.device)
        self.kv_cache = self.runner.kv_cache  # this rank's KV heads; the others hold theirs under the same ids
        self.bytes_per_token = self.kv_cache.bytes_per_token
        num_pages = self.kv_cache.num_pages
        self.events = EventLog()
        self.pool = PagePool(num_pages, config.page_size)
        self.key_salt = f"{self.model_name}:{model_digest(self.loaded)}:{self.kv_cache.layout_fingerprint}"
        journal = PageJournal()
        self.index = PrefixIndex(self.pool, events=self.events, key_salt=self.key_salt, journal=journal)
        self.tenants = load_tenants(config.tenants_file) if config.tenants_file else TenantsConfig()
        self.scheduler = Scheduler(
            self.index,
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_step_tokens=config.max_step_tokens,
                max_prefill_beside_decodes=None
                if config.max_prefill_beside_decodes == AUTO
                else config.max_prefill_beside_decodes,
                strict_isolation=config.isolation == IsolationMode.STRICT,
                prefix_caching=config.prefix_caching,
            ),
            ledger=self._ledger(),
        )
        self.offload = executor_for(
            config, self.kv_cache, self.scheduler, self.tenants, journal, self.events, self.key_salt
        )
        self.limits = RequestLimits(self.max_model_len, config.page_size, self.pool.capacity, model_config.vocab_size)
        shared_prefix = config.isolation == IsolationMode.SHARED_PREFIX
        self._shared_prefixes = declared_prefixes(self.tenants, self.loaded) if shared_prefix else ()
        self._fresh_metrics()
        # Who receives the timing of each step that ran the model (simulator calibration records them).
        self.step_listeners: list[Callable[[StepTiming], None]] = []
        self._live: dict[str, LiveRequest] = {}
        # max_prefill_beside_decodes `auto` is timed on this engine's steps once it is built (`budget_probe.
        # build_engine`); until `use_prefill_budget`, a step's prefill beside decodes is bounded by the step budget.
        self.prefill_budget: PrefillBudget | None = None  # what `auto` timed, if it was auto
        self.metrics.prefill_beside_decodes(self.scheduler.config.max_prefill_beside_decodes)
        self._update_gauges()

    def use_prefill_budget(self, budget: PrefillBudget) -> None:
        """The budget `auto` timed: the scheduler and this engine's config carry its number, and the metrics
        start afresh (they count nothing the probe did)."""
        self.prefill_budget = budget
        self.scheduler.config = replace(self.scheduler.config, max_prefill_beside_decodes=budget.tokens)
        self.config = replace(self.config, max_prefill_beside_decodes=budget.tokens)
        self._fresh_metrics()
        self.metrics.prefill_beside_decodes(budget.tokens)
        self._update_gauges()

    def _fresh_metrics(self) -> None:
        """The Prometheus exporter, counting from zero, and the event listeners it heads."""
        self.metrics = EngineMetrics(self.model_name, self.tenants.quota_pages(self.pool.capacity))
        self.metrics.capacity(self.pool.capacity * self.config.page_size, self.bytes_per_token)
        # Who receives each step's cache events (stored / hit / evicted / moved pages), in order: the
        # Prometheus exporter always; a validation may add a recorder (see sim/validate.py).
        self.event_listeners: list[Callable[[list[CacheEvent]], None]] = [self.metrics.events]

    def _ledger(self) -> TenantLedger | None:
        if not self.tenants.tenants:
            return None
        try:
            return self.tenants.ledger(self.pool.capacity)
        except ValueError as exc:  # the file's reservations exceed this device tier
            raise SettingsError(f"{self.config.tenants_file}: {exc}") from None

    # --- requests -------------------------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> None:
        """Queue a request checked against `self.limits` (the server checks each one at its boundary; a request
        beyond them is the caller's bug). ValueError for an id already running."""
        if request.request_id in self._live:
            raise ValueError(f"request_id {request.request_id!r} is already running")
        # The one check the engine repeats, being cheap: a token id outside the vocabulary indexes the embedding
        # out of bounds, which on CUDA is a device-side fault that corrupts the whole device state (every
        # request's KV with it), not an error of this request alone.
        ids = request.prompt_ids
        if ids and not (0 <= min(ids) and max(ids) < self.limits.vocab_size):
            raise ValueError(f"prompt: a token id is outside the vocabulary [0, {self.limits.vocab_size})")
        prompt = np.asarray(ids, dtype=np.int32)
        stops = frozenset() if request.ignore_eos else frozenset(request.stop_token_ids) | self.loaded.eos_token_ids
        core_request = Request(
            RequestId(request.request_id),
            prompt,
            request.max_tokens,
            tenant=TenantId(request.tenant),
            shared_tokens=shared_tokens_of(prompt, self._shared_prefixes),
            stop_token_ids=stops,
            use_cached_prefix=request.prompt_logprobs is None,
        )
        self._live[request.request_id] = LiveRequest(
            request, request.sampling.generator(self.device), list(request.prompt_ids)
        )
        admission = self.offload.submit(core_request, self.clock())
        if admission is not None:  # None: a restore from a lower tier runs first
            self._admit(admission)

    def _admit(self, admission: Admission) -> None:
        self._live[admission.request.request_id].page_tiers = admission.page_tiers
        self.scheduler.add(admission.request)

    def abort(self, request_id: str, reason: str = "abort") -> StepOutput | None:
        """End a request between steps (a stop string, or the client left); its computed pages stay cached."""
        now = self.clock()
        restoring = self.offload.holds(request_id)
        if restoring is not None:
            self.offload.cancel(restoring)
            finished = FinishedRequest(restoring.request_id, len(restoring.prompt), 0, (), reason)
        else:
            finished = self.scheduler.finish(RequestId(request_id), now, reason)
        if request_id in self.runner.swapped:
            self._execute(DropSwap(request_id))
        if finished is None:
            return None
        return self._finish(finished)

    def park(self, request_id: str) -> bool:
        """Set a request aside while its client reads nothing (`core/parking.py`): it holds no batch slot and
        no device page until `resume`. False if it is not in the scheduler (finished, or restoring)."""
        parked = self.scheduler.park(RequestId(request_id), self.clock())
        if parked:
            self.metrics.parked_request()
            self._update_gauges()
        return parked

    def resume(self, request_id: str) -> bool:
        """Readmit a parked request, first in line."""
        resumed = self.scheduler.resume(RequestId(request_id))
        self._update_gauges()
        return resumed

    def has_work(self) -> bool:
        return self.scheduler.has_work() or self.offload.num_restoring > 0

    def reset_prefix_cache(self) -> int:
        """Drop every cached page no running request holds, in every tier (the shared remote tier too);
        returns how many device pages were freed."""
        result = self.index.evict(self.index.evictable_pages, self.clock())
        self.offload.clear()
        self._update_gauges()
        return result.num_freed

    # --- the step -----------------------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """One step; with no work it only keeps the tiers in order (idle pages move down by TTL)."""
        started = time.perf_counter()
        now = self.clock()
        # Only restores in flight: wait a moment for one instead of spinning.
        wait_s = 0.05 if not self.scheduler.has_work() else 0.0
        for admission in self.offload.begin_step(now, wait_s):
            self._admit(admission)
        plan = self.scheduler.schedule(now)
        self.offload.sync_pages(now)  # pages evicted by the schedule leave before this step overwrites them
        for swap in plan.swap_out:  # first: these pages may be reused by this very plan
            self._execute(SwapOut(swap.request_id, tuple(swap.pages)))
        for swap in plan.swap_in:
            self._execute(SwapIn(swap.request_id, tuple(swap.pages)))
        outputs: list[StepOutput] = []
        if plan.seqs:
            sampled, outputs, failed = run_isolating(self._run, plan.seqs)
            computed = replace(plan, seqs=tuple(s for s in plan.seqs if s.request_id not in failed))
            for finished in self.scheduler.postprocess(computed, sampled, self.clock()):
                outputs.append(self._finish(finished))
            outputs.extend(self._fail(request_id, error) for request_id, error in failed.items())
        self.offload.sync_pages(now)  # pages just cached go to the shared tier
        self.offload.end_step()  # this step's demotions, written while the model ran, enter the tier policy
        events = self.events.take_events()
        for listener in self.event_listeners:
            listener(events)
        self.metrics.tier_failures(self.offload.failures())
        self._update_gauges()
        if plan.seqs:
            timing = StepTiming(tuple((s.start, s.end) for s in plan.seqs), time.perf_counter() - started)
            for listener in self.step_listeners:
                listener(timing)
        return outputs

    def _run(self, seqs: tuple[ScheduledSeq, ...]) -> tuple[dict[RequestId, int], list[StepOutput]]:
        live = [self._live[item.request_id] for item in seqs]
        for item, request in zip(seqs, live):
            request.count_cached(item.num_cached_tokens, self.config.page_size)
        need_all = any(
            request.request.prompt_logprobs is not None and item.start < len(request.request.prompt_ids)
            for item, request in zip(seqs, live)
        )
        chunks = [
            SequenceChunk(request.tokens[item.start : item.end], item.start, item.page_table)
            for item, request in zip(seqs, live)
        ]
        result = self._execute(Forward(chunks_of(chunks), need_all))
        assert isinstance(result, ForwardResult)
        batch, logits = result.batch, result.logits
        last_rows = [start + length - 1 for start, length in zip(batch.query_starts, batch.query_lens)]
        if need_all:
            for index, (item, request) in enumerate(zip(seqs, live)):
                if request.request.prompt_logprobs is not None:
                    rows = logits[batch.query_starts[index] : last_rows[index] + 1]
                    request.collect_prompt_logprobs(item.start, item.end, rows)
            logits = logits[torch.tensor(last_rows, device=logits.device)]
        chosen = [index for index, item in enumerate(seqs) if item.samples]
        sampled: dict[RequestId, int] = {}
        outputs: list[StepOutput] = []
        if not chosen:
            return sampled, outputs
        rows = logits[torch.tensor(chosen, device=logits.device)]
        picked = sample(rows, [live[i].request.sampling for i in chosen], [live[i].generator for i in chosen])
        want_top = max((live[i].request.logprobs or 0) for i in chosen)
        wants_logprobs = any(live[i].request.logprobs is not None for i in chosen)
        logprobs = token_logprobs(rows, picked, top_k=want_top) if wants_logprobs else None
        picked_list = picked.tolist()
        for row, index in enumerate(chosen):
            item, request = seqs[index], live[index]
            token = int(picked_list[row])
            sampled[item.request_id] = token
            request.tokens.append(token)
            outputs.append(
                StepOutput(
                    request_id=item.request_id,
                    token_id=token,
                    logprob=TokenLogprob.of(logprobs, row, request.request.logprobs) if logprobs else None,
                    prompt_tokens=len(request.request.prompt_ids),
                    cached_tokens=request.cached_tokens or 0,
                    cached_tokens_by_tier=request.cached_tokens_by_tier,
                    prompt_logprobs=request.take_prompt_logprobs(),
                )
            )
        self.metrics.generated(len(chosen))
        return sampled, outputs

    def _execute(self, op: DeviceOp) -> ForwardResult | None:
        """Device work: the other ranks get the op first (their collectives wait for this rank's)."""
        self.ranks.send(op)
        return self.runner.execute(op)

    def _finish(self, finished: FinishedRequest) -> StepOutput:
        request = self._live.pop(finished.request_id, None)
        by_tier = request.cached_tokens_by_tier if request is not None else None
        if by_tier is None:
            by_tier = {DEVICE_TIER: finished.num_cached_tokens} if finished.num_cached_tokens else {}
        tenant = request.request.tenant if request is not None else "default"
        self.metrics.finished(
            finished.finish_reason, finished.prompt_tokens, finished.num_cached_tokens, tenant, by_tier
        )
        return StepOutput(
            request_id=finished.request_id,
            token_id=None,
            finish_reason=finished.finish_reason,
            prompt_tokens=finished.prompt_tokens,
            cached_tokens=finished.num_cached_tokens,
            cached_tokens_by_tier=by_tier,
        )

    def _fail(self, request_id: RequestId, error: str) -> StepOutput:
        """End a request whose computation failed: its client gets the error; its pages are released and
        none of them is cached (its KV may be what failed)."""
        log.warning("request %s failed: %s", request_id, error)
        finished = self.scheduler.finish(request_id, self.clock(), "error", cache=False)
        assert finished is not None  # it was in this step's plan
        return replace(self._finish(finished), error=f"the engine could not compute this request: {error}")

    def _update_gauges(self) -> None:
        self.metrics.occupancy(
            used=self.pool.capacity - self.pool.num_free,
            total=self.pool.capacity,
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting,
            parked=self.scheduler.num_parked,
            bytes_per_token=self.bytes_per_token,
        )
        pages = {(t, DEVICE_TIER): n for t, n in self.index.pages_by_tenant().items()}
        pages.update(self.offload.pages_by_tenant())
        self.metrics.set_tenant_pages(pages)

    def close(self) -> None:
        """Stop the offload executor's workers (restores in flight are dropped)."""
        self.offload.close()

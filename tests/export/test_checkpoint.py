"""The safetensors reader: sharded checkpoints, bfloat16, GPT-2's Conv1D and prefix-less names,
and export streaming one tensor at a time (peak RSS well under the artifact's size)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ortserve.export.checkpoint import Checkpoint
from ortserve.export.errors import ExportError


def test_sharded_checkpoint_exports_the_same_weights(tiny_checkpoint, tiny_artifact, tmp_path):
    import torch
    from ortserve.export import export_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint("llama2"), dtype=torch.float32)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(Checkpoint(sharded).files()) > 1
    export_model(sharded, tmp_path / "out", progress=False)
    single = tiny_artifact("llama2") / "model.onnx.data"
    assert (tmp_path / "out" / "model.onnx.data").read_bytes() == single.read_bytes()


def test_missing_shard_is_a_clear_error(tiny_checkpoint, tmp_path):
    import shutil

    folder = shutil.copytree(tiny_checkpoint("llama2"), tmp_path / "c")
    weights = folder / "model.safetensors"
    index = {"weight_map": {name: "model-00002-of-00002.safetensors" for name in Checkpoint(folder).names()}}
    weights.rename(folder / "model-00001-of-00002.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ExportError, match="lacks shard"):
        Checkpoint(folder)


def test_bfloat16_tensors_widen_exactly_to_float32(tmp_path):
    import torch
    from safetensors.torch import save_file

    values = torch.randn(5, 7).to(torch.bfloat16)
    save_file({"w": values, "h": torch.randn(3).half()}, tmp_path / "model.safetensors")
    checkpoint = Checkpoint(tmp_path)
    np.testing.assert_array_equal(checkpoint.read("w"), values.float().numpy())
    assert checkpoint.read("h").dtype == np.float32


def test_gpt2_weights_without_transformer_prefix_are_found(tiny_checkpoint, tmp_path):
    """The original GPT-2 checkpoints name tensors 'h.0.attn...' rather than 'transformer.h.0...'."""
    from ortserve.export.architectures import architecture_for
    from safetensors.numpy import save_file

    source = Checkpoint(tiny_checkpoint("gpt2_conv1d"))
    (tmp_path / "config.json").write_text((tiny_checkpoint("gpt2_conv1d") / "config.json").read_text())
    save_file({n.removeprefix("transformer."): source.read(n) for n in source.names()}, tmp_path / "model.safetensors")
    bare = Checkpoint(tmp_path, architecture_for("gpt2").strip_prefixes)
    np.testing.assert_array_equal(
        bare.read("transformer.h.0.attn.c_attn.weight"), source.read("transformer.h.0.attn.c_attn.weight")
    )


def test_gpt2_conv1d_weights_are_transposed_to_out_in(tiny_checkpoint):
    from ortserve.export.weights import WeightSource

    checkpoint = Checkpoint(tiny_checkpoint("gpt2_conv1d"))
    stored = checkpoint.read("transformer.h.0.mlp.c_fc.weight")  # Conv1D: [in 64, out 256]
    assert stored.shape == (64, 256)
    np.testing.assert_array_equal(
        WeightSource(checkpoint).read("transformer.h.0.mlp.c_fc.weight", transpose=True), stored.T
    )


def test_fp32_export_peak_rss_stays_under_the_output_size(tmp_path):
    """A 60M-parameter (240 MB) Llama exports in fp32 with peak RSS < 1.5x the artifact size:
    weights stream tensor by tensor into model.onnx.data. Measured in a fresh process."""
    from safetensors.numpy import save_file

    hidden, inter, layers, vocab = 512, 1536, 8, 32000
    config = dict(
        model_type="llama",
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    rng = np.random.default_rng(0)
    folder = tmp_path / "mid"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {
        "model.embed_tokens.weight": (vocab, hidden),
        "lm_head.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (hidden, hidden),
            p + "self_attn.k_proj.weight": (256, hidden),
            p + "self_attn.v_proj.weight": (256, hidden),
            p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
    save_file(
        {n: rng.standard_normal(s, dtype=np.float32) * 0.02 for n, s in tensors.items()}, folder / "model.safetensors"
    )
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from ortserve.export import export_model
        from ortserve.export.pipeline import peak_rss_bytes
        export_model({str(folder)!r}, {str(tmp_path / "out")!r}, progress=False)
        size = sum(p.stat().st_size for p in Path({str(tmp_path / "out")!r}).iterdir())
        print(peak_rss_bytes(), size, 'torch' in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    peak, size, torch_imported = result.stdout.split()
    assert torch_imported == "False"
    assert int(peak) < 1.5 * int(size), f"peak RSS {int(peak) >> 20} MiB vs artifact {int(size) >> 20} MiB"


def test_bfloat16_checkpoint_exports_and_matches_transformers(tiny_checkpoint, tmp_path):
    """Most released checkpoints are bf16: exported fp32, they match transformers run in fp32."""
    import torch
    from ortserve.export import export_model
    from ortserve.export.validate import validate_artifact
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint("qwen3_qk_norm"), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "bf16")
    assert Checkpoint(tmp_path / "bf16")._entry("model.embed_tokens.weight")[2]["dtype"] == "BF16"
    export_model(tmp_path / "bf16", tmp_path / "out", progress=False)
    report = validate_artifact(tmp_path / "out", tmp_path / "bf16", prompt_lens=(19, 7), tolerance=1e-4)
    assert report.ok, report.summary()

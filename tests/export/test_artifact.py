"""The artifact matches docs/design.md §2: graph inputs/outputs, ORT contrib ops on the hot path,
hidden states gathered before the LM head, external weights, manifest and side files."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from ortserve.artifact import EXPORT_BASE_OP_VERSION, OP_VERSION, ArtifactError, load_manifest


def graph_of(artifact):
    return onnx.load(artifact / "model.onnx", load_external_data=False).graph


def test_graph_inputs_and_outputs_follow_the_contract(tiny_artifact):
    graph = graph_of(tiny_artifact("llama2"))
    F, I64, I32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.INT32
    kinds = {
        i.name: (i.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
        for i in graph.input
    }
    assert kinds["input_ids"] == (I64, ["num_tokens"])
    assert kinds["positions"] == (I64, ["num_tokens"])
    assert kinds["slot_mapping"] == (I64, ["num_tokens"])
    assert kinds["block_tables"] == (I32, ["num_seqs", "max_blocks_per_seq"])
    assert kinds["context_lens"] == (I32, ["num_seqs"])
    assert kinds["query_start_loc"] == (I32, ["num_seqs_plus_1"])
    assert kinds["logits_indices"] == (I64, ["num_logits"])
    for layer in range(2):
        for kind in ("key", "value"):
            assert kinds[f"{kind}_cache.{layer}"] == (F, ["num_blocks", 2, "block_size", 32])
    outputs = [o.name for o in graph.output]
    assert outputs == ["logits"] + [f"{k}_cache_out.{l}" for l in range(2) for k in ("key", "value")]


def test_hot_path_uses_ort_contrib_ops(tiny_artifact):
    ops = [(n.domain, n.op_type) for n in graph_of(tiny_artifact("llama2")).node]
    assert ops.count(("ortserve", "PackedPagedAttention")) == 2  # split, rotary, cache and attention
    assert ops.count(("ortserve", "MatMulF")) == 2 * 4 + 1 and ("", "MatMul") not in ops
    outside_rope = {n.op_type for n in graph_of(tiny_artifact("llama2")).node if not n.name.startswith("rope.")}
    assert not {"Split", "RotaryEmbedding", "Reshape", "Sigmoid", "Mul"} & outside_rope


def attributes(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def test_a_decoder_layer_is_five_nodes(tiny_artifact):
    """Every node is a kernel launch, and a small model's decode step is mostly launches: a Llama
    layer is qkv (the attention norm inside it), attention, o, gate_up (the MLP norm inside, the
    residual sum its second output), down (the gated activation inside); around them only the
    embedding, the two gathers of the sampled rows, the LM head (the final norm inside) and the
    output, and once per step the rotary rows (positions to cos and sin, and the rows' indices)."""
    nodes = graph_of(tiny_artifact("llama2")).node
    layer = [n for n in nodes if n.name.startswith("layers.1.")]
    assert [n.op_type for n in layer] == ["MatMulF", "PackedPagedAttention", "MatMulF", "MatMulF", "MatMulF"]
    qkv, _, _, gate_up, down = layer
    assert qkv.input[3] == "model.layers.1.input_layernorm.weight" and len(qkv.output) == 2  # x + residual out
    assert gate_up.input[3] == "model.layers.1.post_attention_layernorm.weight" and len(gate_up.output) == 2
    assert attributes(qkv)["norm_epsilon"] == pytest.approx(1e-6) and attributes(down) == {"gated": b"silu"}
    assert not {"SkipSimplifiedLayerNormalization", "GatedActivation"} & {n.op_type for n in nodes}
    rope = [n.op_type for n in nodes if n.name.startswith("rope.")]
    assert sorted(rope) == sorted(["Cast", "Unsqueeze", "Mul", "Cos", "Sin", "Shape", "Gather", "Range"])
    assert len(nodes) == 5 * 2 + 5 + len(rope)


def test_folding_the_inputs_keeps_the_logits(tiny_checkpoint, tmp_path):
    """The same checkpoint exported with its norms and gated activations as nodes of their own
    (``fold_inputs=False``, as the calibration's reference is) and inside the linears gives the same
    logits, up to the order of float sums; Gemma 3 (sandwich norms, which stay nodes) and Qwen 2 (a
    qkv bias before the stage's inputs) included."""
    import numpy as np
    from ortserve.export import export_model
    from ortserve.export.validate import PagedRunner

    tokens = [3, 17, 42, 5, 9, 11, 2, 30]
    for case in ("llama2", "gemma3_local_global", "qwen2_qkv_bias_tied"):
        logits = []
        for fold in (False, True):
            out = tmp_path / f"{case}-{fold}"
            export_model(tiny_checkpoint(case), out, precision="fp32", progress=False, fold_inputs=fold)
            nodes = graph_of(out).node
            assert any("norm_epsilon" in attributes(n) for n in nodes if n.op_type == "MatMulF") == fold
            runner = PagedRunner(out, num_blocks=8)
            logits.append(
                np.stack(
                    [runner.step([(0, tokens[:4])], all_logits=True)[0][-1]]
                    + [runner.step([(0, [t])])[0] for t in tokens[4:]]
                )
            )
        np.testing.assert_allclose(logits[1], logits[0], rtol=0, atol=2e-5 * np.abs(logits[0]).max())


def test_layer_norm_models_use_skip_layer_normalization(tiny_artifact):
    ops = [n.op_type for n in graph_of(tiny_artifact("gpt2_conv1d")).node]
    assert ops.count("SkipLayerNormalization") == 4 and "RotaryEmbedding" not in ops
    assert "GatedActivation" not in ops  # GPT-2's MLP is not gated


def test_hidden_states_are_gathered_before_the_final_norm_and_lm_head(tiny_artifact):
    nodes = list(graph_of(tiny_artifact("llama2")).node)
    gathers = [i for i, n in enumerate(nodes) if "logits_indices" in n.input]
    head = next(i for i, n in enumerate(nodes) if n.name.startswith("lm_head"))
    assert len(gathers) == 2 and max(gathers) < head
    assert nodes[head].input[3] == "model.norm.weight"  # the final norm runs inside the head
    assert {nodes[g].output[0] for g in gathers} == {nodes[head].input[0], nodes[head].input[4]}


def test_tied_fp32_lm_head_shares_the_embedding(tiny_artifact):
    """MatMulF takes W as [out, in], the embedding's own layout: the head reads the embedding's
    initializer itself, with no Transpose and no second copy in the file."""
    graph = graph_of(tiny_artifact("qwen2_qkv_bias_tied"))
    head = next(n for n in graph.node if n.name.startswith("lm_head") and n.op_type == "MatMulF")
    embed = next(n for n in graph.node if n.name.startswith("embed"))
    assert head.input[1] == embed.input[0] == "model.embed_tokens.weight"
    assert "Transpose" not in {n.op_type for n in graph.node}
    assert sum(1 for t in graph.initializer if t.name == "model.embed_tokens.weight") == 1


def test_a_linear_bias_is_the_ops_third_input(tiny_artifact):
    graph = graph_of(tiny_artifact("qwen2_qkv_bias_tied"))
    qkv = next(n for n in graph.node if n.name.startswith("layers.0.") and n.op_type == "MatMulF")
    assert qkv.input[2].endswith(".bias") and qkv.input[3].endswith("input_layernorm.weight")
    o = next(n for n in graph.node if n.name.startswith("layers.0.o") and n.op_type == "MatMulF")
    assert len(o.input) == 2  # no bias and no stage: nothing after W
    assert "Add" not in {n.op_type for n in graph.node if n.name.startswith("layers.")}


def test_attention_attributes_carry_the_architecture_quirks(tiny_artifact):
    graph = graph_of(tiny_artifact("gemma2_softcap_sandwich"))
    attrs = [
        {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        for n in graph.node
        if n.op_type == "PackedPagedAttention"
    ]
    assert [a["sliding_window"] for a in attrs] == [8, 0]
    assert all(a["softcap"] == pytest.approx(2.0) and a["scale"] == pytest.approx(24**-0.5) for a in attrs)
    assert all((a["num_heads"], a["num_kv_heads"]) == (4, 2) for a in attrs)


def test_weights_live_in_one_external_data_file(tiny_artifact):
    artifact = tiny_artifact("llama2")
    model = onnx.load(artifact / "model.onnx", load_external_data=False)
    assert model.ir_version == 10
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, "com.microsoft": 1, "ortserve": 1}
    big = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert big and {e.value for t in big for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    assert (artifact / "model.onnx").stat().st_size < 100_000


def test_manifest_describes_the_model(tiny_artifact, tiny_checkpoint):
    m = load_manifest(tiny_artifact("qwen3_qk_norm"))
    assert (m.architecture, m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_size, m.vocab_size) == (
        "qwen3",
        2,
        64,
        4,
        2,
        32,
        320,
    )
    # the op set its graph needs, not the installed library's: a library one version behind loads it
    assert (m.weight_precision, m.lm_head_precision, m.max_model_len) == ("fp32", "fp32", 128)
    assert m.op_version == EXPORT_BASE_OP_VERSION < OP_VERSION
    assert m.eos_token_ids == [2] and len(m.source_fingerprint) == 64
    from safetensors.numpy import load_file

    tensors = load_file(tiny_checkpoint("qwen3_qk_norm") / "model.safetensors")
    assert m.num_parameters == sum(t.size for t in tensors.values())


def test_artifact_needing_newer_custom_ops_is_refused_with_the_fix(tiny_artifact, tmp_path):
    import shutil

    copy = tmp_path / "newer"
    shutil.copytree(tiny_artifact("llama2"), copy)
    manifest = json.loads((copy / "ortserve.json").read_text())
    (copy / "ortserve.json").write_text(json.dumps({**manifest, "op_version": OP_VERSION + 1}))
    with pytest.raises(ArtifactError, match=f"custom ops version {OP_VERSION + 1}.*Upgrade ortserve, or re-export"):
        load_manifest(copy)


def test_generation_config_is_always_present(tiny_artifact):
    generation = json.loads((tiny_artifact("gpt2_conv1d") / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2


def test_export_never_imports_torch(tiny_checkpoint, tmp_path):
    script = (
        f"import sys; from ortserve.export import export_model; "
        f"export_model({str(tiny_checkpoint('gemma3_local_global'))!r}, {str(tmp_path / 'o')!r}, "
        f"precision='int4', progress=False); print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_tied_quantised_head_also_serves_the_embedding(tiny_artifact):
    """No float copy of the tied embedding: GatherQ8 reads the (int8) LM head's codes."""
    graph = graph_of(tiny_artifact("qwen2_qkv_bias_tied", "int4"))
    embed = next(n for n in graph.node if n.name.startswith("embed."))
    head = next(n for n in graph.node if n.name.startswith("lm_head"))
    assert (embed.op_type, head.op_type) == ("GatherQ8", "MatMulQ8")
    assert embed.input[:2] == head.input[1:3] == ["lm_head.codes", "lm_head.scales"]
    assert "model.embed_tokens.weight" not in {t.name for t in graph.initializer}


def test_validate_compares_the_new_artifact_with_transformers(tiny_checkpoint, tmp_path, capsys):
    from ortserve.export import export_model

    export_model(tiny_checkpoint("gemma2_softcap_sandwich"), tmp_path / "out", validate=True)
    summary = capsys.readouterr().err
    assert "validation   max |logit diff|" in summary and "top-1 agreement 100.0%" in summary


def test_failed_validation_leaves_no_artifact(tiny_checkpoint, tmp_path, monkeypatch):
    import ortserve.export.validate as validate
    from ortserve.export import ExportError, export_model

    monkeypatch.setattr(
        validate, "validate_artifact", lambda *a, **k: validate.ValidationReport(0.5, 0.9, 10, tolerance=1e-3)
    )
    with pytest.raises(ExportError, match="validation failed: max \\|logit diff\\| 5.00e-01"):
        export_model(tiny_checkpoint("llama2"), tmp_path / "out", validate=True, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_artifact_directory_has_ordinary_permissions(tiny_artifact):
    import os
    import stat

    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(tiny_artifact("llama2").stat().st_mode) == 0o777 & ~mask

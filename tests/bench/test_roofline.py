"""The decode roofline's weight bytes per token (benchmarks/roofline.py): a table that is only
gathered costs one row (counted as nothing), a table that is also the LM head is read in full."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from roofline import hf_weight_bytes, onnx_weight_bytes, roofline_tok_s

EMB = np.zeros((100, 8), dtype=np.float32)  # 3200 bytes
W = np.zeros((8, 8), dtype=np.float32)  # 256 bytes
LM = np.zeros((8, 100), dtype=np.float32)  # 3200 bytes


def save_graph(path: Path, tied: bool) -> Path:
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h0"]), helper.make_node("MatMul", ["h0", "w"], ["h1"])]
    inits = [numpy_helper.from_array(EMB, "emb"), numpy_helper.from_array(W, "w")]
    if tied:
        nodes.append(helper.make_node("MatMul", ["h1", "emb"], ["logits"], name="lm_head_tied_via_transpose"))
    else:
        nodes.append(helper.make_node("MatMul", ["h1", "lm"], ["logits"]))
        inits.append(numpy_helper.from_array(LM, "lm"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        inits,
    )
    onnx.save(helper.make_model(graph), path)
    return path


def test_a_gather_only_embedding_is_not_read_per_token(tmp_path):
    assert onnx_weight_bytes(save_graph(tmp_path / "untied.onnx", tied=False)) == W.nbytes + LM.nbytes


def test_a_tied_embedding_is_read_in_full_as_the_lm_head(tmp_path):
    assert onnx_weight_bytes(save_graph(tmp_path / "tied.onnx", tied=True)) == W.nbytes + EMB.nbytes


def write_safetensors(folder: Path, tensors: dict[str, int], tied: bool) -> Path:
    header, offset = {}, 0
    for name, nbytes in tensors.items():
        header[name] = {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
    (folder / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    return folder


def test_hf_checkpoint_counts_the_embedding_only_when_tied(tmp_path):
    tensors = {"model.embed_tokens.weight": 4000, "model.layers.0.mlp.up_proj.weight": 400, "lm_head.weight": 4000}
    (tmp_path / "untied").mkdir()
    assert hf_weight_bytes(write_safetensors(tmp_path / "untied", tensors, tied=False)) == 4400
    (tmp_path / "tied").mkdir()
    del tensors["lm_head.weight"]
    assert hf_weight_bytes(write_safetensors(tmp_path / "tied", tensors, tied=True)) == 4400


def test_roofline_is_bandwidth_over_bytes():
    assert roofline_tok_s(20.0, 500_000_000) == 40.0


@pytest.mark.parametrize("system", ["ortserve-iq4xs", "ortserve-q4km"])
def test_a_variant_on_files_of_its_own_is_measured_by_them(system, tmp_path, monkeypatch):
    """ortserve-iq4xs serves an artifact exported from llama.cpp's IQ4_XS file (ortserve-q4km: Q4_K_M), not
    the model's int4 artifact beside it: its roofline counts the bytes of the one it serves."""
    import report
    from runners import ortserve_runner

    monkeypatch.setattr(ortserve_runner, "RESULTS", tmp_path)
    plain = ortserve_runner.artifact_path("m", "int4")
    own = report.RUNNERS[system].weights("m", "int4")
    for folder, tied in ((plain, False), (own.parent, True)):
        folder.mkdir(parents=True)
        save_graph(folder / "model.onnx", tied=tied)
    assert own.parent != plain and own.parent.parent == plain.parent
    assert report.weight_bytes(system, "int4", "m") == W.nbytes + EMB.nbytes
    assert report.weight_bytes("ortserve", "int4", "m") == W.nbytes + LM.nbytes

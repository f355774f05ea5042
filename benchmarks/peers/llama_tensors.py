"""llama.cpp's intermediate tensors for one token sequence, through ggml's eval callback (run in
benchmarks/.venv-peers; the other half of benchmarks/gguf_rounding.py):

    python llama_tensors.py MODEL.gguf IDS.json NAME[,NAME...] OUT.npz

NAMEs are ggml graph names, e.g. attn_norm-0, Vcur-0, l_out-5 (layer after the dash). Every f32
tensor of that name is copied out after it is computed, f32 KV cache, 2 threads, one batch.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
from llama_cpp import llama_cpp as lib

GGML = ctypes.CDLL(str(Path(lib.__file__).parent / "lib" / "libggml-base.so"))
GGML.ggml_get_name.restype, GGML.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
GGML.ggml_nbytes.restype, GGML.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
GGML.ggml_nelements.restype, GGML.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
GGML.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
NE_OFFSET = 16  # struct ggml_tensor: enum type, buffer pointer, then int64_t ne[4]


def dump(model: Path, ids: list[int], names: set[str]) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {}

    @ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)
    def observe(tensor, ask, _user):
        name = GGML.ggml_get_name(tensor).decode()
        if ask:
            return name in names
        count, size = GGML.ggml_nelements(tensor), GGML.ggml_nbytes(tensor)
        if size == 4 * count:  # f32
            data = np.empty(count, np.float32)
            GGML.ggml_backend_tensor_get(tensor, data.ctypes.data, 0, size)
            ne = (ctypes.c_int64 * 4).from_address(tensor + NE_OFFSET)
            found[name] = data.reshape([int(n) for n in reversed(ne)])
        return True

    defaults = lib.llama_context_default_params

    def with_callback():
        params = defaults()
        params.cb_eval, params.cb_eval_user_data = observe, None
        return params

    lib.llama_context_default_params = with_callback  # Llama() builds its context from these
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), n_ctx=512, n_batch=512, n_threads=2, type_k=0, type_v=0, verbose=False)
    llm.eval(ids)
    return found


if __name__ == "__main__":
    model, ids_file, names, out = sys.argv[1:]
    tensors = dump(Path(model), json.loads(Path(ids_file).read_text()), set(names.split(",")))
    np.savez(out, **tensors)
    print({k: v.shape for k, v in tensors.items()})

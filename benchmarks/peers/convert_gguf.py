"""convert_hf_to_gguf.py from the llama-cpp-python sdist, with one fallback: a tokenizer whose
pre-tokenizer hash llama.cpp does not know gets the pre-tokenizer named by --pre-fallback
instead of an error. The Qwen2.5-0.5B-shape checkpoint needs it: SmolLM2's vocabulary with
Qwen2's pre-tokenizer (see make_qwen_shape.py) is, by construction, a combination no hub model has.

    python convert_gguf.py CONVERT_HF_TO_GGUF.py --pre-fallback qwen2 -- HF_DIR --outtype f32 --outfile OUT
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> int:
    script = Path(sys.argv[1]).resolve()
    rest = sys.argv[2:]
    fallback = None
    if rest[:1] == ["--pre-fallback"]:
        fallback, rest = rest[1], rest[2:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    sys.path.insert(0, str(script.parent))
    sys.path.insert(1, str(script.parent / "gguf-py"))
    if fallback:
        from conversion.base import TextModel

        original = TextModel.get_vocab_base_pre

        def get_vocab_base_pre(self, tokenizer):
            try:
                return original(self, tokenizer)
            except NotImplementedError:
                print(f"convert_gguf: unknown pre-tokenizer hash, using {fallback!r}", file=sys.stderr)
                return fallback

        TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(script), *rest]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``ortserve export SRC -o OUT``: the command-line face of ``export_model``."""

from __future__ import annotations

import argparse
import sys

from ortserve.artifact import DEFAULT_ACTIVATION_BITS, PRECISIONS

HELP = "export a Hugging Face checkpoint, .gguf file or built-in model to an ortserve artifact"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="checkpoint directory, .gguf file, or built-in model name")
    parser.add_argument("-o", "--output", dest="out", required=True, metavar="OUT", help="artifact directory to write")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="weight precision of the linear layers (int4: MatMulQ4, int5: MatMulQ5, int8: MatMulQ8; blocks of "
        "32). Default: the source's own -- fp32 for a checkpoint; a GGUF file's quantised tensors keep their codes "
        "exactly (under any precision but fp32)",
    )
    parser.add_argument(
        "--lm-head-precision",
        choices=PRECISIONS,
        default=None,
        help="precision of the LM head (default: fp32 for fp32, else int8: the head is the most "
        "quantisation-sensitive matmul)",
    )
    parser.add_argument(
        "--activation-bits",
        type=int,
        choices=(8, 16),
        default=DEFAULT_ACTIVATION_BITS,
        help="activations of the quantised linears: 16 (int8 plus an int8 residual, about 16 bits: answers as "
        "with float activations) or 8 (int8 blocks as llama.cpp's: about 1.7x the prefill speed, some answers "
        f"differ). Default {DEFAULT_ACTIVATION_BITS}",
    )
    parser.add_argument(
        "--tensor-precision",
        action="append",
        default=[],
        metavar="PATTERN=PRECISION",
        help="store the linear weights whose checkpoint name matches the regular expression PATTERN at PRECISION "
        "(repeatable; the first match wins), as llama-quantize's --tensor-type: for example "
        "--precision int4 --tensor-precision 'v_proj|down_proj=int8' keeps a model's most sensitive linears at 8 "
        "bits (benchmarks/tables/int4_sensitivity.md measures which)",
    )
    parser.add_argument(
        "--pure",
        action="store_true",
        help="with --precision int4, keep every layer linear at 4 bits even when the export's check on its "
        "calibration text finds that 4 bits lose the model's answers (by default it then quantises again with "
        "more bits where llama.cpp's Q4_K_M puts them), as llama-quantize's --pure",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        metavar="N",
        help="longest sequence the artifact serves (default: the model's max positions)",
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="compare the artifact's logits with transformers (needs torch: pip install ortserve[validate])",
    )
    parser.add_argument(
        "--no-quality-check",
        dest="quality_check",
        action="store_false",
        help="skip the quality check that follows quantising float weights (top-1 agreement and perplexity "
        "ratio against an fp32 export of the same source, on built-in text; it needs the fp32 export's disk "
        "space for a moment). A GGUF's own codes are not checked: they are the file's",
    )
    parser.add_argument(
        "--calibration-text",
        default=None,
        metavar="FILE",
        help="UTF-8 text to calibrate the quantiser on (as llama-imatrix's -f): each input column's mean square "
        "activation on it weights that column's rounding error. Default: built-in text (Python docstrings, prose "
        "and code); text like the model's own use is best",
    )
    parser.add_argument(
        "--no-calibration",
        dest="calibrate",
        action="store_false",
        help="quantise float weights without calibration (plain least-squares search per block; no fp32 "
        "reference export needed unless the quality check runs)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars or summary")


def run(args: argparse.Namespace) -> int:
    from .errors import ExportError
    from .pipeline import export_model

    try:
        export_model(
            args.src,
            args.out,
            precision=args.precision,
            lm_head_precision=args.lm_head_precision,
            activation_bits=args.activation_bits,
            tensor_precision=args.tensor_precision,
            pure=args.pure,
            max_model_len=args.max_model_len,
            validate=args.validate,
            quality_check=args.quality_check,
            calibrate=args.calibrate,
            calibration_text=args.calibration_text,
            progress=not args.quiet,
        )
    except ExportError as exc:
        print(f"ortserve export: error: {exc}", file=sys.stderr)
        return 1
    return 0

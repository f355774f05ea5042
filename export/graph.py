"""The one decoder graph every architecture shares (docs/design.md §2), emitted with onnx.helper.

Everything is 2-D over the flattened batch [T, ·]: no padding, no batch axis. Per layer:

    x, h = SkipNorm(delta, h)                  # residual add fused with the next norm
    a = Linear_o(PackedPagedAttention(Linear_qkv(x), caches, slots, tables, ..., rows, cos, sin
                                      [, q_norm, k_norm]))   # split, q/k norm, rotary, cache, attention
    x, h = SkipNorm(PostNorm(a), h)            # PostNorm: Gemma 2/3 only
    delta = PostNorm(Linear_down(GatedActivation(Linear_gate_up(x))))   # act(gate) * up, one node

Hidden states are gathered at ``logits_indices`` before the final norm and the LM head.
CPU-fast ORT contrib ops: SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization,
SkipLayerNormalization; ours (domain ``ortserve``): PackedPagedAttention, GatedActivation, MatMulF,
MatMulQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K and their GatherQ lookups. Every node
is a kernel launch and a decode step of a small model is mostly launches, so each layer is as few
nodes as we can make it: the norm or gated activation in front of a linear runs inside the linear's
node (``linear_inputs``), so a Llama layer is five nodes. fp32 linears are ``MatMulF`` on the
checkpoint's [out, in] weights, which the op repacks at load (a tied fp32 LM head passes the
embedding itself); quantised ones ``MatMulQ4`` / ``MatMulQ8`` (w = d * q + m per block of 32: GGUF
codes kept exactly, float weights quantised, see ``qweight.py``; GGUF's K-quants ``MatMulQ4K`` / ``Q5K`` /
``Q6K`` at their own widths, ``kquants.py``),
with 8- or 16-bit activations (``activation_bits``). A tied quantised LM head serves the embedding
lookup too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from ortserve.artifact import LOGITS_OUTPUT

from . import storage
from .architectures import Architecture
from .calibration import Importance
from .config import ModelSpec
from .errors import ExportError
from .gptq import quantize_calibrated
from .graph_io import MS, OURS, make_model
from .kquants import KQuantWeight, concat_kquant
from .linear_inputs import NO_BIAS, fuse_linear_inputs
from .nbits import QuantizedWeight
from .qweight import QWeight, concat_q, from_blocks, quantize_q
from .rope import RopeTable, rope_frequencies, rope_step_nodes
from .weights import WeightJob, WeightSource

GATED_ACTIVATIONS = ("silu", "gelu_tanh")  # what ortserve.GatedActivation computes


class DecoderBuilder:
    """Emits nodes and plans weight jobs; ``build()`` returns (model without weights, jobs)."""

    def __init__(
        self,
        spec: ModelSpec,
        arch: Architecture,
        source: WeightSource,
        *,
        precision: str | None = "fp32",
        lm_head_precision: str | None = "fp32",
        max_model_len: int | None = None,
        activation_bits: int = 8,
        tensor_precision: tuple[storage.TensorPrecision, ...] = (),
        importance: Importance | None = None,
        fold_inputs: bool = True,
    ):
        """``precision`` None: each tensor as the source stores it (a GGUF's codes, fp32 floats).
        ``activation_bits``: 8 (int8 activations in the quantised linears) or 16 (int8 + a residual).
        ``tensor_precision``: per-tensor exceptions to ``precision`` (``storage.TensorPrecision``).
        ``importance``: calibration of the float weights this builder quantises (``calibration.capture``).
        ``fold_inputs``: each norm and gated activation in front of a linear runs inside the linear's
        node (``linear_inputs``); False keeps them nodes of their own, so every linear's input is a
        graph tensor (the calibration reads them)."""
        self.spec, self.arch, self.src = spec, arch, source
        self.activation_bits = activation_bits
        self.precision, self.lm_head_precision = precision, lm_head_precision
        self.tensor_precision = tensor_precision
        self.importance = importance
        self.fold_inputs = fold_inputs
        self.max_model_len = max_model_len or spec.max_position_embeddings
        self.nodes: list[onnx.NodeProto] = []
        self.constants: dict[str, onnx.TensorProto] = {}
        self.jobs: list[WeightJob] = []
        self._count = 0
        self.stored: dict[str, storage.Storage] = {}  # "linear label/weight name" -> how it is stored

    # ---- small emitters ------------------------------------------------------------------
    def op(
        self,
        op_type: str,
        inputs: list[str],
        n_out: int = 1,
        *,
        domain: str = "",
        name: str = "",
        outputs: list[str] | None = None,
        **attrs,
    ) -> list[str]:
        self._count += 1
        base = f"{name or op_type}.{self._count}"
        outputs = outputs or [f"{base}.out{i}" if n_out > 1 else base for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=base, domain=domain, **attrs))
        return outputs

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self.constants:
            self.constants[name] = onnx.numpy_helper.from_array(np.asarray(value), name)
        return name

    def ints(self, *values: int) -> str:
        return self.const("const.i64." + "_".join(map(str, values)), np.array(values, np.int64))

    def scalar(self, value: float) -> str:
        return self.const(f"const.f32.{value!r}", np.array(value, np.float32))

    def plan(self, label: str, make: Callable[[], dict[str, np.ndarray]]) -> None:
        self.jobs.append(WeightJob(label, make))

    # ---- weights ---------------------------------------------------------------------------
    def vector(self, name: str, size: int, offset: float = 0.0) -> str:
        self.src.expect(name, (size,))
        self.plan(name, lambda: {name: self.src.read(name) + np.float32(offset)})
        return name

    def norm_weights(self, module: str, size: int) -> list[str]:
        offset = 1.0 if self.arch.norm == "rms_offset" else 0.0
        names = [self.vector(f"{module}.weight", size, offset)]
        if self.arch.norm == "layer":
            names.append(self.vector(f"{module}.bias", size))
        return names

    def linear(
        self,
        x: str,
        label: str,
        parts: list[tuple[str, int]],
        k: int,
        precision: str | None,
        share: str | None = None,
        conv1d: bool | None = None,
    ) -> str:
        """y = x @ W.T + b for W = concat(parts) [N, K]; parts are (module, rows), each stored as
        ``storage.plan`` says (parts stored differently get one node each, then a Concat).
        ``share`` names an fp32 initializer to use as W."""
        transpose = self.arch.conv1d if conv1d is None else conv1d
        weights = [share] if share else [self.src.expect(f"{m}.weight", (rows, k), transpose) for m, rows in parts]
        plans = [
            storage.FP32 if share else storage.plan(self.src, w, precision, self.tensor_precision) for w in weights
        ]
        if len({p.key for p in plans}) > 1:
            starts = [i for i in range(len(parts)) if i == 0 or plans[i].key != plans[i - 1].key]
            pieces = [parts[a:b] for a, b in zip(starts, [*starts[1:], len(parts)])]
            outs = [
                self.linear(x, f"{label}.{j}", piece, k, precision, conv1d=conv1d) for j, piece in enumerate(pieces)
            ]
            return self.op("Concat", outs, axis=-1, name=f"{label}.concat")[0]
        plan = plans[0]
        self.stored.update({f"{label}/{w}": plan for w in weights})
        bias = self.bias(label, parts)

        def full_weight() -> np.ndarray:
            arrays = [self.src.read(w, transpose) for w in weights]
            return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

        if plan.kind == "fp32":  # MatMulF on W [N, K] as stored; a tied head passes the embedding itself
            w = share or f"{label}.weight"
            if not share:
                self.plan(w, lambda: {w: np.ascontiguousarray(full_weight())})
            return self.op("MatMulF", [x, w] + ([bias] if bias else []), domain=OURS, name=label)[0]

        n = sum(rows for _, rows in parts)
        return self.q_linear(x, label, weights, plans, transpose, n, k, bias)

    def q_linear(
        self,
        x: str,
        label: str,
        weights: list[str],
        plans: list[storage.Storage],
        transpose: bool,
        n: int,
        k: int,
        bias: str | None,
    ) -> str:
        """One MatMulQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K node: each part's GGUF codes as they are, or float weights
        quantised."""
        self.plan_codes(label, weights, plans, transpose, k)
        inputs = [x, f"{label}.codes", f"{label}.scales"] + ([bias] if bias else [])
        op_type = f"MatMulQ{plans[0].q_format}"
        return self.op(op_type, inputs, domain=OURS, name=label, N=n, K=k, activation_bits=self.activation_bits)[0]

    def plan_codes(self, label: str, weights: list[str], plans: list[storage.Storage], transpose: bool, k: int) -> None:
        """``{label}.codes`` and ``{label}.scales``: the weights stacked, in the layout of the MatMulQ / GatherQ op
        of ``plans[0].q_format``."""
        bits = plans[0].bits

        def part(w: str, plan: storage.Storage) -> QWeight | KQuantWeight:
            if plan.kind == "exact":
                blocks = self.src.import_blocks(w)
                if not isinstance(blocks, QuantizedWeight):
                    return blocks
                return from_blocks(blocks, k, plan.bits, plan.variant.startswith("NL"), plan.variant.endswith("S"))
            gram = self.importance.gram(label) if self.importance else None
            weight = self.src.read(w, transpose)
            return quantize_q(weight, bits) if gram is None else quantize_calibrated(weight, bits, gram)

        def make() -> dict[str, np.ndarray]:
            parts = [part(w, p) for w, p in zip(weights, plans)]
            whole = concat_q(parts) if isinstance(parts[0], QWeight) else concat_kquant(parts)  # type: ignore[arg-type,type-var]
            codes, scales = whole.packed()
            return {f"{label}.codes": codes, f"{label}.scales": scales}

        self.plan(f"{label} ({plans[0].label})", make)

    def bias(self, label: str, parts: list[tuple[str, int]]) -> str | None:
        """One bias for the fused parts (zeros for parts without one), or None if none has one."""
        present = [self.src.has(f"{m}.bias") for m, _ in parts]
        if not any(present):
            return None
        for (m, rows), has in zip(parts, present):
            if has:
                self.src.expect(f"{m}.bias", (rows,))
        name = f"{label}.bias"
        self.plan(
            name,
            lambda: {
                name: np.concatenate(
                    [
                        self.src.read(f"{m}.bias") if has else np.zeros(rows, np.float32)
                        for (m, rows), has in zip(parts, present)
                    ]
                )
            },
        )
        return name

    # ---- blocks ----------------------------------------------------------------------------
    def norm(self, x: str, module: str, size: int | None = None) -> str:
        size = size or self.spec.hidden_size
        w = self.norm_weights(module, size)
        if self.arch.norm == "layer":
            return self.op("LayerNormalization", [x, *w], axis=-1, epsilon=self.spec.norm_eps, name="ln")[0]
        return self.op(
            "SimplifiedLayerNormalization", [x, *w], axis=-1, epsilon=self.spec.norm_eps, stash_type=1, name="rms"
        )[0]

    def skip_norm(self, delta: str, residual: str, module: str) -> tuple[str, str]:
        """(norm(residual + delta), residual + delta) in one fused op."""
        w = self.norm_weights(module, self.spec.hidden_size)
        if self.arch.norm == "layer":
            out = self.op(
                "SkipLayerNormalization",
                [delta, residual, *w],
                4,
                domain=MS,
                name="skip_ln",
                epsilon=self.spec.norm_eps,
            )
        else:
            out = self.op(
                "SkipSimplifiedLayerNormalization",
                [delta, residual, *w],
                4,
                domain=MS,
                name="skip_rms",
                epsilon=self.spec.norm_eps,
            )
        return out[0], out[3]

    def rope_inputs(self, layer: int, ropes: dict[str, list[str]]) -> list[str]:
        """[row of each token, cos, sin] of this layer's rope, made once per step for every layer
        with the same rope (Gemma's local and global layers differ): this step's rows, or for
        ``dynamic`` a table of every position."""
        key = self.spec.rope_key(layer)
        if key not in ropes:
            freqs = rope_frequencies(self.spec.ropes[key], self.max_model_len)
            if isinstance(freqs, RopeTable):
                cos, sin = f"rope.{key}.cos", f"rope.{key}.sin"
                self.plan(f"rope.{key}", lambda t=freqs: {cos: t.cos, sin: t.sin})
                ropes[key] = ["positions", cos, sin]
            else:
                nodes, consts, inputs = rope_step_nodes(freqs, f"rope.{key}")
                self.nodes += nodes
                self.constants.update({c.name: c for c in consts})
                ropes[key] = list(inputs)
        return list(ropes[key])  # the caller appends its layer's q/k norms

    def attention(self, x: str, layer: int, ropes: dict[str, list[str]]) -> str:
        """One PackedPagedAttention node on the fused qkv projection: it splits q/k/v, applies the
        q/k norms (Qwen3, Gemma 3) and rotary, writes the cache and attends."""
        s, n, i = self.spec, self.arch.names, layer
        q_size, kv_size = s.num_heads * s.head_size, s.num_kv_heads * s.head_size
        parts = (
            [(n.qkv.format(i=i), q_size + 2 * kv_size)]
            if n.qkv
            else [(n.q.format(i=i), q_size), (n.k.format(i=i), kv_size), (n.v.format(i=i), kv_size)]
        )
        qkv = self.linear(x, f"layers.{i}.qkv", parts, s.hidden_size, self.precision)
        optional = self.rope_inputs(i, ropes) if s.ropes else []
        if n.q_norm or n.k_norm:  # positional optional inputs: the norms come after the rope tables
            if not (s.ropes and n.q_norm and n.k_norm):
                raise ExportError(f"{s.model_type}: q/k norms need rotary and both of q_norm, k_norm")
            optional += [self.norm_weights(m.format(i=i), s.head_size)[0] for m in (n.q_norm, n.k_norm)]
        attn, _, _ = self.op(
            "PackedPagedAttention",
            [
                qkv,
                f"key_cache.{i}",
                f"value_cache.{i}",
                "slot_mapping",
                "block_tables",
                "context_lens",
                "query_start_loc",
                *optional,
            ],
            outputs=[f"layers.{i}.attn", f"key_cache_out.{i}", f"value_cache_out.{i}"],
            domain=OURS,
            name=f"layers.{i}.attention",
            num_heads=s.num_heads,
            num_kv_heads=s.num_kv_heads,
            scale=float(s.attn_scales[i]),
            sliding_window=s.window_for(i),
            softcap=float(s.attn_softcap),
            norm_epsilon=float(s.norm_eps),
        )
        return self.linear(attn, f"layers.{i}.o", [(n.o.format(i=i), s.hidden_size)], q_size, self.precision)

    def mlp(self, x: str, layer: int) -> str:
        s, n, i = self.spec, self.arch.names, layer
        size = s.intermediate_size
        if not self.arch.gated_mlp:
            hidden = self.activation(
                self.linear(x, f"layers.{i}.up", [(n.up.format(i=i), size)], s.hidden_size, self.precision)
            )
        else:
            parts = (
                [(n.gate_up.format(i=i), 2 * size)]
                if n.gate_up
                else [(n.gate.format(i=i), size), (n.up.format(i=i), size)]
            )
            gate_up = self.linear(x, f"layers.{i}.gate_up", parts, s.hidden_size, self.precision)
            if s.activation in GATED_ACTIVATIONS:  # one node for split, activation and product
                hidden = self.op(
                    "GatedActivation", [gate_up], domain=OURS, name=f"layers.{i}.gated", activation=s.activation
                )[0]
            else:
                gate, up = self.op("Split", [gate_up, self.ints(size, size)], 2, axis=1, name="split_gate_up")
                hidden = self.op("Mul", [self.activation(gate), up], name="gated")[0]
        return self.linear(hidden, f"layers.{i}.down", [(n.down.format(i=i), s.hidden_size)], size, self.precision)

    def activation(self, x: str) -> str:
        kind = self.spec.activation
        if kind == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])[0]], name="silu")[0]
        if kind == "relu":
            return self.op("Relu", [x])[0]
        return self.op("Gelu", [x], approximate="tanh" if kind == "gelu_tanh" else "none")[0]

    # ---- whole graph -----------------------------------------------------------------------
    def build(self) -> tuple[onnx.ModelProto, list[WeightJob]]:
        s, n = self.spec, self.arch.names
        embed = self.src.expect(f"{n.embed}.weight", (s.vocab_size, s.hidden_size))
        tied = s.tie_word_embeddings or not self.src.has(f"{n.lm_head}.weight")
        head_plan = (
            storage.plan(self.src, embed, self.lm_head_precision, self.tensor_precision) if tied else storage.FP32
        )
        # The lookup reads quantised rows where there are some (GatherQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K): a tied,
        # quantised LM head's bytes, or an untied embedding's own GGUF codes (rows exact, and no fp32 table,
        # which for a 7B model's 128k x 4096 is 2 GiB); an embedding of floats stays an fp32 Gather.
        embed_plan = head_plan if tied else storage.plan(self.src, embed, self.precision, self.tensor_precision)
        codes = "lm_head" if tied and head_plan.kind != "fp32" else None
        if not tied and embed_plan.kind == "exact":
            self.plan_codes("embed", [embed], [embed_plan], False, s.hidden_size)
            self.stored[f"embed/{embed}"] = embed_plan
            codes = "embed"
        if codes:
            h = self.op(
                f"GatherQ{embed_plan.q_format}",
                [f"{codes}.codes", f"{codes}.scales", "input_ids"],
                domain=OURS,
                name="embed",
                N=s.vocab_size,
                K=s.hidden_size,
            )[0]
        else:
            self.plan(embed, lambda: {embed: self.src.read(embed)})
            h = self.op("Gather", [embed, "input_ids"], axis=0, name="embed")[0]
        if s.embed_scale != 1.0:
            h = self.op("Mul", [h, self.scalar(s.embed_scale)], name="embed_scale")[0]
        if n.pos_embed:
            wpe = self.src.expect(f"{n.pos_embed}.weight", (s.max_position_embeddings, s.hidden_size))
            self.plan(wpe, lambda: {wpe: self.src.read(wpe)})
            h = self.op("Add", [h, self.op("Gather", [wpe, "positions"], axis=0, name="pos_embed")[0]])[0]

        ropes: dict[str, list[str]] = {}
        delta = None
        for i in range(s.num_layers):
            if delta is None:
                x = self.norm(h, n.attn_norm.format(i=i))
            else:
                x, h = self.skip_norm(delta, h, n.attn_norm.format(i=i))
            a = self.attention(x, i, ropes)
            if n.attn_post_norm:
                a = self.norm(a, n.attn_post_norm.format(i=i))
            x, h = self.skip_norm(a, h, n.mlp_norm.format(i=i))
            delta = self.mlp(x, i)
            if n.mlp_post_norm:
                delta = self.norm(delta, n.mlp_post_norm.format(i=i))

        h = self.op("Gather", [h, "logits_indices"], axis=0, name="select_h")[0]
        delta = self.op("Gather", [delta, "logits_indices"], axis=0, name="select_delta")[0]
        x, _ = self.skip_norm(delta, h, n.final_norm)
        share = embed if tied and head_plan.kind == "fp32" else None
        head = [(n.embed if tied else n.lm_head, s.vocab_size)]
        logits = self.linear(x, "lm_head", head, s.hidden_size, self.lm_head_precision, share=share, conv1d=False)
        if s.final_softcap:
            cap = self.scalar(s.final_softcap)
            logits = self.op("Mul", [self.op("Tanh", [self.op("Div", [logits, cap])[0]])[0], cap])[0]
        self.op("Identity", [logits], outputs=[LOGITS_OUTPUT])
        nodes = fuse_linear_inputs(self.nodes) if self.fold_inputs else self.nodes
        if any(NO_BIAS in node.input for node in nodes):
            self.const(NO_BIAS, np.zeros(0, np.float32))
        return make_model(self.spec, nodes, list(self.constants.values())), self.jobs

"""What the planner chooses between: ``Candidate``, one model file with its per-layer shapes
(``LayerShape``), exact from a GGUF header or estimated from the catalog, and the quality
score a choice ranks it by."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..catalog import QUANT_QUALITY, is_embedding_header

if TYPE_CHECKING:
    from ..catalog import ModelSpec, Variant
    from ..gguf import GGUFHeader


def estimated_score(params: float) -> float:
    """A benchmark score for a model with no published one, kept below the published scores of
    models its size so that a guess never outranks a measurement: MMLU 5-shot of the catalog's
    scored models grows about 6 points per doubling of parameters from ~50 at 1B (Llama 3.2 1B
    49.3, Llama 3.1 8B 69.4, Qwen3 32B 83.6), capped at 80, 25 being chance on four choices."""
    return max(25.0, min(80.0, 50.0 + 6.0 * math.log2(max(params, 1.0) / 1e9)))


@dataclass(frozen=True)
class LayerShape:
    """What one repeating layer weighs and keeps per token."""

    weight_bytes: int
    read_bytes: int
    """Bytes read per decoded token (less than weight_bytes for a mixture of experts)."""
    kv_elements_per_token: int
    sliding_window: int | None = None
    expert_bytes: int = 0
    """A mixture of experts: the layer's expert tensors (every expert's up, gate and down
    projections), which a placement may keep in RAM (``n_cpu_moe``)."""
    expert_read_bytes: int = 0
    """What a decoded token reads of them: the active experts' share."""


@dataclass(frozen=True)
class Candidate:
    """One model file the planner may choose: exact from a GGUF header, or estimated from the
    catalog."""

    name: str
    """What to call it: ``gemma3:270m-q4_k_m`` or a file name."""
    model: str
    """The model without the quant (``gemma3:270m``), or the file name."""
    quant: str
    file_bytes: int
    layers: tuple[LayerShape, ...]
    output_bytes: int
    """The output head and final norm (for tied embeddings: the embedding table)."""
    embedding_bytes: int
    """The token embedding table, which llama.cpp keeps in RAM."""
    tied_embeddings: bool
    other_bytes: int
    n_embd: int
    n_ff: int
    n_vocab: int
    context_length: int
    """Trained context (0 = unknown)."""
    params: int
    active_params: int
    """Parameters used per token (= params unless mixture-of-experts)."""
    quality: float
    """Quant quality 0..1 (catalog.QUANT_QUALITY)."""
    estimated: bool
    """True when the sizes come from the catalog, not a header."""
    installed: bool = False
    n_head: int = 0
    """Attention (query) heads: size the attention scores when flash attention is off."""
    head_dims: int = 0
    """Key plus value length of one attention head."""
    benchmark: float = 0.0
    """The model's published benchmark score at full precision, 0..100 (0 = none)."""
    benchmark_source: str = ""
    embedding_only: bool = False
    """An embedding model: no decode speed (it generates nothing); its prefill rate is its
    embedding throughput, and a plan never picks it over a model that generates text."""

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def has_experts(self) -> bool:
        """A mixture of experts whose expert tensors a placement can keep in RAM."""
        return any(layer.expert_bytes for layer in self.layers)

    @property
    def weight_bytes(self) -> int:
        return (sum(layer.weight_bytes for layer in self.layers) + self.embedding_bytes
                + self.other_bytes + (0 if self.tied_embeddings else self.output_bytes))

    @property
    def full_precision_score(self) -> float:
        """The published benchmark score, else one estimated from the parameters (MoE: the
        geometric mean of total and active)."""
        if self.benchmark:
            return self.benchmark
        effective = math.sqrt(self.params * self.active_params) if self.active_params \
            else self.params
        return estimated_score(effective)

    @property
    def quality_score(self) -> float:
        """The benchmark score this file keeps: full-precision score x the quant's share."""
        return self.full_precision_score * self.quality

    @property
    def quality_reason(self) -> str:
        """How quality_score was reached, in words for the plan."""
        if self.benchmark:
            what = f"{self.benchmark:g} ({self.benchmark_source})"
        else:
            what = f"{self.full_precision_score:.0f} (estimated from {self.params / 1e9:.2g}B" \
                   " parameters: no published score)"
        return (f"quality {self.quality_score:.1f} = {what} x {self.quality:.3f} for"
                f" {self.quant} (perplexity, llama-quantize's table)")

    @property
    def prefill_flops_per_token(self) -> float:
        """2 x parameters used per prompt token outside the embedding and output head (the
        head runs once per prompt, for the last token)."""
        body = self.params - self._embedding_params() * (1 if self.tied_embeddings else 2)
        active = self.active_params or self.params
        share = active / self.params if self.params else 1.0
        return 2.0 * max(body, self.params * 0.1) * min(1.0, share * 1.15)

    def _embedding_params(self) -> int:
        return self.n_vocab * self.n_embd

    def window_attention_share(self, cells: int = 256) -> float:
        """What attending over ``cells`` more cells in every sliding-window layer adds to a
        prompt token's arithmetic: 2 x heads x (key + value length) a cell and layer, against
        prefill_flops_per_token."""
        window_layers = sum(1 for layer in self.layers if layer.sliding_window is not None)
        per_token = self.prefill_flops_per_token
        if not window_layers or not per_token:
            return 0.0
        return cells * window_layers * 2.0 * self.n_head * self.head_dims / per_token

    # --- constructors ----------------------------------------------------------------------
    @classmethod
    def from_header(cls, header: GGUFHeader, *, name: str, model: str | None = None,
                    installed: bool = True) -> Candidate:
        n_layers = header.block_count
        weights = header.layer_bytes()[:n_layers]
        experts = [0] * n_layers
        for t in header.tensors:
            m = re.match(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_exps\.", t.name)
            if m and int(m.group(1)) < n_layers:
                experts[int(m.group(1))] += t.n_bytes
        used, total = header.expert_used_count, header.expert_count
        share = used / total if used and total else 1.0
        kv = header.layer_kv()
        layers = tuple(
            LayerShape(weight_bytes=weights[i],
                       read_bytes=int(weights[i] - experts[i] * (1 - share)),
                       kv_elements_per_token=kv[i].elements_per_token,
                       sliding_window=kv[i].sliding_window, expert_bytes=experts[i],
                       expert_read_bytes=int(experts[i] * share))
            for i in range(n_layers))
        params = header.parameter_count
        expert_params = sum(t.n_elements for t in header.tensors if "_exps." in t.name)
        active = int(params - expert_params * (1 - share)) if expert_params else params
        tied = not any(t.name == "output.weight" for t in header.tensors)
        quant = header.quant
        return cls(
            name=name, model=model or name, quant=quant, file_bytes=header.file_size,
            layers=layers, output_bytes=header.output_bytes,
            embedding_bytes=header.embedding_bytes, tied_embeddings=tied,
            other_bytes=header.other_bytes, n_embd=header.embedding_length,
            n_ff=header.feed_forward_length, n_vocab=header.vocab_size,
            context_length=header.context_length, params=params, active_params=active,
            quality=QUANT_QUALITY.get(quant, 0.9), estimated=False, installed=installed,
            n_head=header.head_count, head_dims=header.key_length + header.value_length,
            embedding_only=is_embedding_header(header.architecture,
                                               header.arch_value("pooling_type")),
        )

    @classmethod
    def from_spec(cls, spec: ModelSpec, variant: Variant, *, installed: bool = False
                  ) -> Candidate:
        """Estimate per-layer bytes from the catalog: the file's bytes per parameter, spread
        over the embedding, the output head and the layers."""
        per_param = variant.size_bytes / spec.params
        embedding = int(spec.vocab * spec.embedding * per_param)
        tied = spec.tied_embeddings
        output = embedding if tied else int(spec.vocab * spec.embedding * per_param)
        body = max(variant.size_bytes - embedding - (0 if tied else output), spec.layers)
        per_layer = body // spec.layers
        share = 1.0
        if spec.active_params:
            embed_params = spec.vocab * spec.embedding * (1 if tied else 2)
            body_params = max(spec.params - embed_params, 1)
            share = min(1.0, max(spec.active_params - embed_params, 0) / body_params)
        head_v = spec.head_dim_v or spec.head_dim
        elements = spec.kv_heads * (spec.head_dim + head_v)
        # The experts' part of a layer, from the share a token reads: read = (1 - e) + e x
        # used / experts, so e = (1 - read) / (1 - used / experts).
        used = spec.experts_used / spec.experts if spec.experts and spec.experts_used else 1.0
        expert_share = min(1.0, (1 - share) / (1 - used)) if used < 1 else 0.0
        experts = int(per_layer * expert_share)
        layers = []
        for i in range(spec.layers):
            window = None
            if spec.sliding_window and (not spec.swa_period or (i + 1) % spec.swa_period):
                window = spec.sliding_window
            layers.append(LayerShape(per_layer, int(per_layer * share), elements, window,
                                     expert_bytes=experts,
                                     expert_read_bytes=int(experts * used)))
        return cls(
            name=spec.variant_name(variant), model=spec.name, quant=variant.quant,
            file_bytes=variant.size_bytes, layers=tuple(layers), output_bytes=output,
            embedding_bytes=embedding, tied_embeddings=tied, other_bytes=0,
            n_embd=spec.embedding, n_ff=spec.feed_forward or 4 * spec.embedding,
            n_vocab=spec.vocab, context_length=spec.context, params=spec.params,
            active_params=spec.active_params or spec.params, quality=variant.quality,
            estimated=variant.estimated, installed=installed, n_head=spec.heads,
            head_dims=spec.head_dim + head_v,
            benchmark=spec.quality, benchmark_source=spec.quality_source,
            embedding_only=spec.embedding_only,
        )


def candidates_for_specs(specs: Iterable[ModelSpec], installed: Iterable[str] = ()
                         ) -> list[Candidate]:
    """Every variant of every spec, estimated from the catalog."""
    have = set(installed)
    return [Candidate.from_spec(s, v, installed=s.variant_name(v) in have)
            for s in specs for v in s.variants]

"""Sampling: llama.cpp's native sampler chain per sequence (penalties, biases, truncation,
temperature, mirostat; a request's own chain in its order, with llama.cpp's fill-in-the-middle
sampler where it names it), the greedy shortcut on the logits, grammar-constrained sampling that
asks the grammar about the best tokens only, and the logits themselves, which the engine's
log-probabilities read."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp as L
import numpy as np
from llama_cpp.llama_grammar import PRIMITIVE_RULES, SchemaConverter

from ...errors import InvalidRequest, LocalInferError
from ..grammar import Grammar, gbnf_nesting, integer_range, number_range, to_gbnf
from ..shortlist import Truncation, best_allowed
from ..types import SamplingParams
from .native import LlamaHandles, _llama_said

STANDARD_CHAIN = ("top_k", "typical_p", "top_p", "min_p", "temperature")
"""The samplers after the penalties and biases, in llama.cpp's default order, where a request
names no chain of its own (``SamplingParams.chain``)."""


class Sampling(LlamaHandles):
    """LlamaBackend's sampler chains, grammars and logits."""

    never_sampled: np.ndarray
    _never_bias: Any
    _argmax_chains: set[int]
    _grammars: dict[int, _Constrained]
    _gbnf: dict[Grammar, str]
    _candidates: np.ndarray | None
    _vocab_ids: np.ndarray | None

    def new_sampler(self, params: SamplingParams, seed: int) -> ctypes.c_void_p:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = L.llama_sampler_chain_add
        if len(self._never_bias):
            add(chain, L.llama_sampler_init_logit_bias(self._n_vocab, len(self._never_bias),
                                                       self._never_bias))
        if params.penalized:
            add(chain, L.llama_sampler_init_penalties(
                self._n_vocab, params.repeat_last_n, params.repeat_penalty,
                params.frequency_penalty, params.presence_penalty))
        if params.logit_bias:
            bias = (L.llama_logit_bias * len(params.logit_bias))(
                *(L.llama_logit_bias(token, value) for token, value in params.logit_bias))
            add(chain, L.llama_sampler_init_logit_bias(self._n_vocab, len(bias), bias))
        if params.grammar is not None:
            try:
                grammar = self._grammar_sampler(params.grammar)
            except LocalInferError:
                L.llama_sampler_free(chain)
                raise
            self._grammars[id(chain)] = _Constrained(
                grammar,
                L.llama_sampler_chain_get(chain, 1 if len(self._never_bias) else 0)
                if params.penalized else None, _truncation(params))
        if params.greedy:
            add(chain, L.llama_sampler_init_greedy())
            if not params.penalized and not params.logit_bias and params.grammar is None:
                self._argmax_chains.add(id(chain))
            return chain
        if params.mirostat:
            # As llama.cpp's common sampler: mirostat replaces the truncating samplers.
            add(chain, L.llama_sampler_init_temp(params.temperature))
            if params.mirostat == 1:
                add(chain, L.llama_sampler_init_mirostat(
                    self._n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100))
            else:
                add(chain, L.llama_sampler_init_mirostat_v2(
                    seed, params.mirostat_tau, params.mirostat_eta))
            return chain
        order = params.chain if params.chain is not None else STANDARD_CHAIN
        for name in order:
            if name == "top_k" and params.top_k > 0:
                add(chain, L.llama_sampler_init_top_k(params.top_k))
            elif name == "typical_p" and params.typical_p < 1.0:
                add(chain, L.llama_sampler_init_typical(params.typical_p, 1))
            elif name == "top_p" and params.top_p < 1.0:
                add(chain, L.llama_sampler_init_top_p(params.top_p, 1))
            elif name == "min_p" and params.min_p > 0.0:
                add(chain, L.llama_sampler_init_min_p(params.min_p, 1))
            elif name == "temperature":
                add(chain, L.llama_sampler_init_temp(params.temperature))
            elif name == "infill":
                add(chain, L.llama_sampler_init_infill(self._vocab))
            # "penalties" ran first, above, where the chain names them (params.penalized)
        add(chain, L.llama_sampler_init_dist(seed))
        return chain

    def sample(self, sampler: ctypes.c_void_p, index: int) -> int:
        if id(sampler) in self._argmax_chains:
            # Greedy with no penalty before it picks the first largest logit of the tokens
            # that may be sampled. numpy finds it in the logits llama.cpp holds (a view, no
            # copy) in ~20 us, after setting the never-sampled ones to -inf in place (~15 us
            # for the starter's 6,250); llama_sampler_sample first fills a candidate array of
            # the whole vocabulary, 0.6 ms a token for the starter's 262k entries, 3% of its
            # decode time. Greedy keeps no state to update.
            logits = self.raw_logits(index)
            logits[self.never_sampled] = -np.inf
            return int(logits.argmax())
        constrained = self._grammars.get(id(sampler))
        if constrained is not None:
            return self._sample_constrained(sampler, constrained, index)
        return L.llama_sampler_sample(sampler, self._ctx, index)

    # --- grammars ------------------------------------------------------------------------
    def check_grammar(self, grammar: Grammar) -> None:
        """Raise InvalidRequest for a grammar llama.cpp cannot use (a schema the converter
        does not take, rules llama.cpp does not parse), before the request is queued."""
        L.llama_sampler_free(self._grammar_sampler(grammar))

    def _grammar_sampler(self, grammar: Grammar) -> ctypes.c_void_p:
        gbnf = self._gbnf.get(grammar)
        if gbnf is None:
            try:
                gbnf = to_gbnf(grammar, schema_rules if not grammar.described else
                               described_schema_rules)
                depth = gbnf_nesting(gbnf)  # once per grammar: the text is cached below
                if depth > MAX_GRAMMAR_NESTING:  # llama.cpp parses groups recursively: a crash
                    raise ValueError(f"the grammar nests groups {depth} deep (a repeated bound"
                                     " such as a large maxItems writes one group per item);"
                                     f" llama.cpp parses at most {MAX_GRAMMAR_NESTING}: lower"
                                     " the bound")
            except (ValueError, KeyError, TypeError, AssertionError, RecursionError,
                    OverflowError) as exc:
                raise InvalidRequest(f"the JSON schema cannot be turned into a grammar: {exc}"
                                     ) from None
            if len(self._gbnf) > 64:  # a few schemas are in use at once; forget the rest
                self._gbnf.clear()
            self._gbnf[grammar] = gbnf
        if grammar.triggers:
            patterns = (ctypes.c_char_p * len(grammar.triggers))(
                *(p.encode() for p in grammar.triggers))
            sampler = L.llama_sampler_init_grammar_lazy_patterns(
                self._vocab, gbnf.encode(), grammar.start_rule.encode(), patterns,
                len(grammar.triggers), None, 0)
        else:
            sampler = L.llama_sampler_init_grammar(self._vocab, gbnf.encode(),
                                                   grammar.start_rule.encode())
        if not sampler:
            said = _llama_said()
            if "left recursion" in said:
                said += (" A rule may not begin with itself, directly or through the rules it"
                         " begins with (root ::= root \"a\"): begin it with text.")
            if grammar.gbnf is not None:
                if not re.search(rf"^\s*{re.escape(grammar.start_rule)}\s*::=", gbnf, re.M):
                    said += f" Its start rule must be named {grammar.start_rule}."
                raise InvalidRequest(f"the grammar is not GBNF that llama.cpp can parse{said}")
            raise InvalidRequest(f"llama.cpp could not parse the grammar{said}")
        return sampler

    def _sample_constrained(self, chain: ctypes.c_void_p, constrained: _Constrained,
                            index: int) -> int:
        """Sample as the chain would from the whole vocabulary with the grammar applied, asking
        the grammar only about the best tokens (see shortlist.best_allowed) where that is
        exact; else about the whole vocabulary, 17-31 ms for the starter's 262k tokens on a
        loaded 2-core x86 (a decode step there: 25 ms unloaded). llama.cpp's common sampler
        instead samples first and asks the grammar about that token only: cheaper, but it
        favours the tokens the grammar-free chain keeps, so it is not the same distribution."""
        logits = self.raw_logits(index)
        logits[self.never_sampled] = -np.inf  # as the chain's bias would, and in place
        grammar = constrained.grammar
        ids = best_allowed(logits, lambda band: self._allows(grammar, band),
                           constrained.truncation)
        if ids is None:
            token = self._pick(chain, self._candidates_of(logits, None), grammar)
        else:
            token = self._pick(chain, self._candidates_of(logits, ids), None)
        L.llama_sampler_accept(grammar, token)
        L.llama_sampler_accept(chain, token)
        return token

    @staticmethod
    def _allows(grammar: ctypes.c_void_p, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows next (its verdict does not depend on logits)."""
        candidates = np.zeros(len(ids), dtype=_TOKEN_DATA)
        candidates["id"] = ids
        L.llama_sampler_apply(grammar, ctypes.byref(_data_array(candidates)))
        return np.isfinite(candidates["logit"])

    def _candidates_of(self, logits: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
        """A llama_token_data array of the given tokens (None: the whole vocabulary, in a
        buffer kept for it: only the worker thread samples)."""
        if ids is not None:
            candidates = np.empty(len(ids), dtype=_TOKEN_DATA)
            candidates["id"] = ids
            candidates["logit"] = logits[ids]
            candidates["p"] = 0.0
            return candidates
        if self._candidates is None:
            self._candidates = np.empty(self._n_vocab, dtype=_TOKEN_DATA)
            self._vocab_ids = np.arange(self._n_vocab, dtype=np.int32)
        candidates = self._candidates
        candidates["id"] = self._vocab_ids  # again each time: samplers reorder the array
        candidates["logit"] = logits
        candidates["p"] = 0.0
        return candidates

    def _pick(self, chain: ctypes.c_void_p, candidates: np.ndarray,
              grammar: ctypes.c_void_p | None) -> int:
        """The chain's choice among ``candidates`` (after the grammar's, if given)."""
        array = _data_array(candidates)
        if grammar is not None:
            L.llama_sampler_apply(grammar, ctypes.byref(array))
            if not np.isfinite(candidates["logit"][:array.size]).any():
                # Accepting any token now would abort the process inside llama.cpp
                # ("Unexpected empty grammar stack"): end this request instead.
                raise InvalidRequest("the grammar allows no token the model can write here"
                                     " (check the grammar or JSON schema: e.g. a character"
                                     " class no token can match).")
        L.llama_sampler_apply(chain, ctypes.byref(array))
        if array.selected < 0:
            raise LocalInferError("the sampler chain selected no token")
        if grammar is not None and not np.isfinite(candidates["logit"][array.selected]):
            # The request's logit_bias banned every token the grammar allows: accepting this
            # one would abort the process inside llama.cpp.
            raise InvalidRequest("'logit_bias' bans every token the grammar allows here (an"
                                 " end-of-generation token banned with -100 after the JSON"
                                 " is complete does so): remove that bias.")
        return int(candidates["id"][array.selected])

    def logits(self, index: int) -> list[float]:
        return self.raw_logits(index).tolist()

    def raw_logits(self, index: int) -> np.ndarray:
        """Batch entry ``index``'s logits as a view of llama.cpp's buffer (no copy)."""
        return np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, index),
                                     shape=(self._n_vocab,))

    def accept(self, sampler: ctypes.c_void_p, tokens: Sequence[int]) -> None:
        constrained = self._grammars.get(id(sampler))
        if constrained is not None:
            # The prompt feeds the repetition penalty only: a grammar constrains the reply.
            if constrained.penalties is not None:
                for token in tokens:
                    L.llama_sampler_accept(constrained.penalties, token)
            return
        for token in tokens:
            L.llama_sampler_accept(sampler, token)

    def force(self, sampler: ctypes.c_void_p, token: int) -> None:
        constrained = self._grammars.get(id(sampler))
        if constrained is not None:
            if not self._allows(constrained.grammar, np.array([token], dtype=np.int32))[0]:
                # Accepting it would abort the process inside llama.cpp.
                raise InvalidRequest("the reply's grammar does not allow the end of the"
                                     " reasoning where its budget ran out; raise"
                                     " thinking.budget_tokens or leave it out.")
            L.llama_sampler_accept(constrained.grammar, token)
        L.llama_sampler_accept(sampler, token)

    def free_sampler(self, sampler: ctypes.c_void_p) -> None:
        self._argmax_chains.discard(id(sampler))
        constrained = self._grammars.pop(id(sampler), None)
        if constrained is not None:
            L.llama_sampler_free(constrained.grammar)
        L.llama_sampler_free(sampler)


@dataclass(frozen=True)
class _Constrained:
    """A sampler chain's grammar (kept out of the chain: see _sample_constrained), the
    chain's penalties sampler, which alone is fed the prompt, and what the chain keeps."""

    grammar: ctypes.c_void_p
    penalties: ctypes.c_void_p | None
    truncation: Truncation


def _truncation(params: SamplingParams) -> Truncation:
    """The truncation new_sampler's chain for ``params`` applies after the grammar."""
    if params.greedy:
        # The first largest logit: penalties or a bias reorder the logits before it.
        return Truncation(greedy=True, whole=params.penalized or bool(params.logit_bias))
    # A request's own chain may truncate in another order: the grammar is asked about all.
    return Truncation(top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                      whole=params.penalized or bool(params.logit_bias) or bool(params.mirostat)
                      or params.typical_p < 1.0 or params.chain is not None)


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _data_array(candidates: np.ndarray) -> L.llama_token_data_array:
    """A llama_token_data_array over a numpy array of _TOKEN_DATA (no copy: llama.cpp's
    samplers edit it in place; the numpy array must outlive the call)."""
    return L.llama_token_data_array(
        data=candidates.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
        size=len(candidates), selected=-1, sorted=False)


def schema_rules(schema: object, rule: str, *, described: bool = False) -> str:
    """GBNF rules defining ``rule`` as JSON that matches ``schema``, by the converter that
    llama-cpp-python ships (llama.cpp's json_schema_to_grammar.py; local $refs only). A
    keyword it cannot enforce (UNENFORCED_KEYWORDS) is refused, unless the schema only
    ``described`` the JSON (a tool's parameters)."""
    converter = _SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                 raw_pattern=False)
    converter.described = described
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object")
    defined = converter.visit(converter.resolve_refs(schema, "request"), rule)
    rules = str(converter.format_grammar())
    # A primitive schema comes back as a built-in rule's name ("string"), not ``rule``.
    return rules if defined == rule else f"{rule} ::= {defined}\n{rules}"


def described_schema_rules(schema: object, rule: str) -> str:
    """``schema_rules`` for a tool's parameters."""
    return schema_rules(schema, rule, described=True)


UNENFORCED_KEYWORDS = ("multipleOf", "uniqueItems", "minProperties", "maxProperties",
                       "dependentRequired", "dependentSchemas", "dependencies", "contains",
                       "minContains", "maxContains", "propertyNames", "patternProperties",
                       "if", "then", "else", "not", "unevaluatedProperties",
                       "unevaluatedItems")
"""JSON Schema keywords the converter does not enforce (it would write a grammar without
them). A response format with one is refused; a tool's parameters keep the rest of their
schema enforced and leave these to the model, as llama-server does."""
_MIN_MAX = (("minLength", "maxLength"), ("minItems", "maxItems"))

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_ANNOTATIONS = {"description", "title", "default", "examples", "$comment", "$schema", "$id",
                "deprecated", "readOnly", "writeOnly"}
"""Keywords that describe a value without constraining it: a schema of these alone admits
any JSON value (Claude Code's tools have such properties)."""


MAX_GRAMMAR_NESTING = 1000
"""Groups nested deeper than this are refused before llama.cpp parses them: its recursive
parser refused 4,096 levels and overflowed the stack (a crash) at 65,536."""


def _plain_string_with_length(schema: dict[str, Any]) -> bool:
    """A string schema bounded only by its length (annotations aside)."""
    lengths = [schema.get(k) for k in ("minLength", "maxLength") if k in schema]
    return (schema.get("type") == "string" and bool(lengths)
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in lengths)
            and set(schema) <= _ANNOTATIONS | {"type", "minLength", "maxLength"})


class _SchemaConverter(SchemaConverter):
    """The shipped converter, plus the numeric bounds it would silently ignore, and a schema
    of annotations alone (any value), which it refuses."""

    described = False

    def _check_all_of(self, schema: dict[str, Any]) -> None:
        """The converter enforces ``allOf`` as the merge of its parts' properties (parts it
        does not visit): only over objects, each part's own keywords enforceable, and not
        beside ``properties`` (which it would take instead, ignoring the parts)."""
        parts = schema["allOf"]
        if "properties" in schema or not isinstance(parts, list) or not parts:
            raise ValueError("'allOf' can be enforced only alone, over object schemas (their"
                             " properties are merged)")
        for part in parts:
            target = part
            if isinstance(part, dict) and isinstance(part.get("$ref"), str):
                target = self._refs.get(part["$ref"])
            if not isinstance(target, dict) or not (
                    target.get("type") == "object" or "properties" in target
                    or set(target) <= _ANNOTATIONS):
                raise ValueError("'allOf' can be enforced only over object schemas (their"
                                 " properties are merged)")
            unenforced = [k for k in UNENFORCED_KEYWORDS if k in target]
            if unenforced:
                raise ValueError(f"'{unenforced[0]}' (in an 'allOf' part) cannot be enforced"
                                 " by a grammar; leave it out")

    def visit(self, schema: Any, name: str) -> str:
        if isinstance(schema, dict):
            unenforced = [k for k in UNENFORCED_KEYWORDS if k in schema]
            if unenforced and not self.described:
                raise ValueError(f"'{unenforced[0]}' cannot be enforced by a grammar; leave it"
                                 " out (or check it after the reply)")
            for keyword in ("enum", "anyOf", "oneOf"):
                if schema.get(keyword) == []:
                    raise ValueError(f"'{keyword}' is an empty list: no value can match it")
            for least, most in _MIN_MAX:
                a, b = schema.get(least), schema.get(most)
                if isinstance(a, int) and isinstance(b, int) and a > b:
                    raise ValueError(f"'{least}' {a} is greater than '{most}' {b}")
            if "allOf" in schema and not self.described:
                self._check_all_of(schema)
            if self.described:
                schema = {k: v for k, v in schema.items() if k not in UNENFORCED_KEYWORDS}
        if isinstance(schema, dict) and _plain_string_with_length(schema):
            # The shipped converter writes a length bound as one nested group per character,
            # which llama.cpp parses recursively: a maxLength of 65,536 overflowed its stack
            # (Claude Code's tools bound a script by 524,288). GBNF's own count does not nest.
            low = int(schema.get("minLength", 0))
            high = schema.get("maxLength")
            count = f"{{{low},{'' if high is None else int(high)}}}"
            char = self._add_primitive("char", PRIMITIVE_RULES["char"])
            return str(self._add_rule(name or "string-length",
                                      f'"\\"" {char}{count} "\\"" space'))
        if isinstance(schema, dict) and schema and set(schema) <= _ANNOTATIONS:
            return str(self._add_rule(name or "any-value", self._add_primitive(
                "value", PRIMITIVE_RULES["value"])))
        if isinstance(schema, dict) and any(k in schema for k in _BOUNDS):
            kind = schema.get("type")
            if kind == "integer":
                return str(self._add_rule(name or "integer-range",
                                          f"({integer_range(schema)}) space"))
            if kind == "number":
                return str(self._add_rule(name or "number-range",
                                          f"({number_range(schema)}) space"))
        return str(super().visit(schema, name))

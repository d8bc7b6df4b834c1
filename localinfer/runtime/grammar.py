"""What a reply must look like, as data: JSON matching a schema, optionally wrapped in a tool
call's markers, or a client's own GBNF text (llama-server's ``grammar``); and the GBNF grammar
that says so to llama.cpp's grammar sampler.

The JSON part is converted from its schema by the backend (llama.cpp's converter lives next to
llama.cpp); this module wraps its rules in the markers and repetition a tool-call format needs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JSON_RULE = "json-value"
"""The name of the rule that the schema's converted rules define."""


@dataclass(frozen=True)
class Grammar:
    """The reply is ``prefix JSON suffix``, repeated with ``separator`` between when that is
    not None, where JSON matches ``schema`` (a JSON text, so that the value is hashable); or,
    when ``gbnf`` is set, whatever that GBNF text allows."""

    schema: str = ""
    prefix: str = ""
    suffix: str = ""
    separator: str | None = None
    """Between repetitions (several tool calls); None allows exactly one."""
    heads: tuple[str, ...] = ()
    """When not empty, ``schema`` is an ``anyOf`` and the JSON of its i-th alternative comes
    after ``heads[i]`` and then ``infix`` (gpt-oss names the function before the JSON)."""
    infix: str = ""
    """GBNF between a head and its JSON."""
    lead: str = ""
    """GBNF before the prefix (gpt-oss's opening of a call it must make)."""
    triggers: tuple[str, ...] = ()
    """Regular expressions that, once one matches the text so far in full, switch the grammar
    on from the start of their first group (a tool call opening). Empty: it constrains the
    reply from its first token."""
    gbnf: str | None = None
    """A whole GBNF text as a client sent it (start rule ``root``); the fields above are then
    unused."""
    reasoning: tuple[str, str] | None = None
    """A thinking model's reasoning tags (open, close): the reply may begin with a reasoning
    block of free text, and the constraint holds after it. An empty open tag: the prompt
    opened the block, so the reply begins inside it and must close it first."""

    @property
    def schema_json(self) -> Any:
        return json.loads(self.schema)

    @property
    def start_rule(self) -> str:
        """The rule llama.cpp's grammar sampler starts from."""
        return REASONED_RULE if self.reasoning is not None else "root"


REASONED_RULE = "reasoned-root"
"""The start rule of a grammar that lets the reply reason first (names that neither the schema
converter nor a client's GBNF are likely to use)."""


def json_grammar(schema: dict[str, Any] | None) -> Grammar:
    """A reply that is one JSON value matching ``schema`` (None: any JSON object)."""
    # Not sorted: the grammar writes the properties in the schema's order.
    return Grammar(json.dumps(schema if schema is not None else {"type": "object"}))


MAX_GBNF_NESTING = 100
"""The deepest nesting of parentheses a client's GBNF may have: llama.cpp parses groups
recursively, and a deep enough nest would overflow the worker thread's stack."""

_NUL_ESCAPES = ("\\x00", "\\u0000", "\\U00000000")


def gbnf_grammar(text: str) -> Grammar:
    """A reply that ``text`` (GBNF, as llama-server's ``grammar`` takes it) allows. Raises
    ValueError for what would crash llama.cpp rather than fail to parse there: groups nested
    deeper than MAX_GBNF_NESTING, and a reply that no token can write, which its grammar
    sampler aborts the process on (a token reference, ``<[id]>`` or ``<name>``; a NUL
    character in a literal, where llama.cpp's matching ends a string). Whether llama.cpp
    can parse the rest is the backend's check."""
    if not text.strip():
        raise ValueError("the grammar is empty")
    depth = deepest = 0
    closer = ""  # the character that ends the literal or class being read, if any
    escaped = comment = False
    for i, char in enumerate(text):
        if comment:
            comment = char not in "\r\n"
        elif closer:
            if closer == '"' and char == "\0":
                raise ValueError("a NUL character in a literal cannot be matched")
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
                if closer == '"' and text.startswith(_NUL_ESCAPES, i):
                    raise ValueError("a NUL character in a literal cannot be matched")
            elif char == closer:
                closer = ""
        elif char in '"[':
            closer = "]" if char == "[" else char
        elif char == "#":
            comment = True
        elif char == "<":
            raise ValueError("token references (<...>) are not supported; write the text"
                             " as a literal")
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    if deepest > MAX_GBNF_NESTING:
        raise ValueError(f"its groups are nested more than {MAX_GBNF_NESTING} deep")
    return Grammar(gbnf=text)


SchemaRules = Callable[[Any, str], str]
"""(schema, rule name) -> GBNF rules that define that rule (and its helpers)."""


def to_gbnf(grammar: Grammar, schema_rules: SchemaRules) -> str:
    """The whole GBNF text of ``grammar``, its start rule ``grammar.start_rule``."""
    text = grammar.gbnf if grammar.gbnf is not None else _constraint_gbnf(grammar, schema_rules)
    if grammar.reasoning is None:
        return text
    open_tag, close_tag = grammar.reasoning
    lead = f"( {_literal(open_tag)} reasoning-text )?" if open_tag else "reasoning-text"
    return (f"{text.rstrip()}\n{REASONED_RULE} ::= {lead} root\n"
            f"reasoning-text ::= {_text_through(close_tag)} [ \\t\\r\\n]*\n")


def _text_through(tag: str) -> str:
    """GBNF for any text up to and including the first ``tag``, exactly: the automaton that
    looks for ``tag`` (whose first character must not recur in it), as rules. ``opened``
    reads a run of the first character and partial tags that another one restarts; after it
    comes a character that breaks the partial tag, or the rest of the tag."""
    first, rest = tag[0], tag[1:]
    if not rest or first in rest:
        raise ValueError(f"the reasoning tag {tag!r} cannot be matched by this grammar")
    restarts = " | ".join(_literal(rest[:k] + first) for k in range(len(rest)))
    opened = f"{_literal(first)} ( {restarts} )*"
    breaks = " | ".join(f"{_literal(rest[:k])} {_not_class(first, rest[k])}".strip()
                        for k in range(len(rest)))
    return f"( {_not_class(first)} | {opened} ( {breaks} ) )* {opened} {_literal(rest)}"


def _not_class(*chars: str) -> str:
    """A GBNF character class of any character but ``chars``."""
    return "[^" + "".join("\\" + c if c in "]\\^-[" else c for c in dict.fromkeys(chars)) + "]"


def _constraint_gbnf(grammar: Grammar, schema_rules: SchemaRules) -> str:
    if not grammar.heads:
        value, rules = JSON_RULE, schema_rules(grammar.schema_json, JSON_RULE)
    else:
        alternatives = grammar.schema_json["anyOf"]
        value = "(" + " | ".join(
            f"{_literal(head)} {grammar.infix} {JSON_RULE}-{i}"
            for i, head in enumerate(grammar.heads)) + ")"
        # The converter writes its shared rules (string, space...) once per schema: alike.
        lines = [line for i, schema in enumerate(alternatives)
                 for line in schema_rules(schema, f"{JSON_RULE}-{i}").splitlines()]
        rules = "\n".join(dict.fromkeys(lines))
    item = " ".join(part for part in (grammar.lead, _literal(grammar.prefix), value,
                                      _literal(grammar.suffix)) if part)
    if grammar.separator is None:
        root = f"root ::= {item}"
    else:
        root = f"root ::= tool-item ({_literal(grammar.separator) or ''} tool-item)*\n" \
               f"tool-item ::= {item}"
    return f"{root}\n{rules}\n"


def _literal(text: str) -> str:
    if not text:
        return ""
    return json.dumps(text)  # GBNF literals take JSON's escapes (\n, \", \\)


MAX_LISTED_INTEGERS = 1000
"""An integer range up to this many values is written out value by value."""


def integer_range(schema: dict[str, Any]) -> str:
    """The GBNF of an integer schema's bounds (``minimum``, ``maximum`` and their exclusive
    forms), which the converter llama-cpp-python ships ignores. A range of up to
    MAX_LISTED_INTEGERS values, or a lower bound of 0 or 1 alone, can be written; any other
    bound is refused (ValueError), never dropped."""
    low = _bound(schema, "minimum", "exclusiveMinimum", math.ceil, 1)
    high = _bound(schema, "maximum", "exclusiveMaximum", math.floor, -1)
    if low is not None and high is not None:
        if high < low:
            raise ValueError(f"no integer lies between {low} and {high}")
        if high - low < MAX_LISTED_INTEGERS:
            return " | ".join(f'"{v}"' for v in range(low, high + 1))
    if high is None and low in (0, 1):
        return ('"0" | ' if low == 0 else "") + "[1-9] [0-9]{0,15}"
    raise ValueError(f"integer bounds {low}..{high} cannot be enforced: give both minimum and"
                     f" maximum at most {MAX_LISTED_INTEGERS} values apart, or a minimum of"
                     " 0 or 1 alone")


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str,
           to_int: Callable[[float], int], step: int) -> int | None:
    value, key = schema.get(inclusive), inclusive
    if value is None and schema.get(exclusive) is not None:
        value, key = schema[exclusive], exclusive
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            not math.isfinite(value):
        raise ValueError(f"'{key}' must be a number")
    bound = to_int(value)
    if key == exclusive and bound == value:
        bound += step
    return bound

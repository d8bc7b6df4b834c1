"""What a reply must look like, as data: JSON matching a schema, optionally wrapped in a tool
call's markers, or a client's own GBNF text (llama-server's ``grammar``); and the GBNF grammar
that says so to llama.cpp's grammar sampler.

The JSON part is converted from its schema by the backend (llama.cpp's converter lives next to
llama.cpp); this module wraps its rules in the markers and repetition a tool-call format needs.
"""

from __future__ import annotations

import json
import math
import re
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
    described: bool = False
    """The schema describes the JSON (a tool's parameters, which the client does not ask to
    be enforced): keywords no grammar can hold (UNENFORCED_KEYWORDS) are left to the model.
    False (a response format): such a keyword is refused, never loosened."""

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
    if gbnf_nesting(text) > MAX_GBNF_NESTING:
        raise ValueError(f"its groups are nested more than {MAX_GBNF_NESTING} deep")
    return Grammar(gbnf=text)


MAX_REPETITION = 1_000_000
"""The largest count a repetition (``x{m,n}``) may give: llama.cpp writes one rule per
repeated item (a string's maxLength of 524,288, Claude Code's, is 524,288 rules)."""
_REPETITION = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")


def gbnf_nesting(text: str) -> int:
    """How deep ``text``'s parenthesised groups nest (outside literals, classes and
    comments). Raises ValueError for what llama.cpp's grammar sampler aborts the process on:
    a token reference (``<[id]>``, ``<name>``), a NUL character in a literal; and for a
    repetition whose minimum passes its maximum or MAX_REPETITION, which llama.cpp's parser
    tries to build until the memory runs out (``"a"{5,2}``: 23 GB, then the OOM killer)."""
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
        elif char == "{":
            _check_repetition(_REPETITION.match(text, i))
    return deepest


def _check_repetition(match: re.Match[str] | None) -> None:
    if match is None:
        return  # not a count: llama.cpp's parser says what is wrong
    low, comma, high = match.groups()
    counts = [int(n) for n in (low, high) if n]
    if any(n > MAX_REPETITION for n in counts):
        raise ValueError(f"the repetition {match.group(0)} counts past {MAX_REPETITION:,}")
    if low and high and comma and int(low) > int(high):
        raise ValueError(f"the repetition {match.group(0)} asks for at least {low} and at"
                         f" most {high}")


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


def integer_range(schema: dict[str, Any]) -> str:
    """The GBNF of an integer schema's bounds (``minimum``, ``maximum`` and their exclusive
    forms), which the converter llama-cpp-python ships ignores: exactly the integers in the
    range, digit by digit (agents' tool schemas bound counts by 2**53 - 1, JavaScript's
    largest safe integer). A bound that is not a finite number is refused (ValueError)."""
    low = _bound(schema, "minimum", "exclusiveMinimum", math.ceil, 1)
    high = _bound(schema, "maximum", "exclusiveMaximum", math.floor, -1)
    if low is not None and high is not None and high < low:
        raise ValueError(f"no integer lies between {low} and {high}")
    return _integers(low, high)


def number_range(schema: dict[str, Any]) -> str:
    """The GBNF of a number schema's bounds where they are whole and inclusive, the minimum
    (if any) not negative, the maximum (if any) not below it (``minimum: 0, maximum: 600000``,
    or a maximum alone, as tool schemas write a timeout): an integer part in range and any
    fraction, the top bound only as itself. Other bounds are refused (ValueError), never
    dropped."""
    try:
        low, high = _whole(schema.get("minimum")), _whole(schema.get("maximum"))
    except ValueError:
        low = high = None
    if ("exclusiveMinimum" in schema or "exclusiveMaximum" in schema
            or (low is None and high is None) or (low is not None and low < 0)
            or (high is not None and high < (0 if low is None else low))):
        raise ValueError("bounds on a 'number' can be enforced only as a whole, inclusive"
                         " minimum of 0 or more and maximum of 0 or more; use an integer or"
                         " leave them out")
    fraction = '("." [0-9]{1,15})?'
    if high is None:
        return f"({_naturals(low or 0, None)}) {fraction}"
    parts = [f'"-" ({_naturals(0, None)}) {fraction}'] if low is None else []
    if high > (low or 0):
        parts.append(f"({_integers(low or 0, high - 1)}) {fraction}")
    parts.append(f'"{high}" ("." "0"{{1,15}})?')
    return " | ".join(parts)


def _whole(value: Any) -> int | None:
    """A bound as an int: None stays None; a whole finite number (5 or 5.0) is its int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ValueError(f"{value!r} is not a whole number")
    return int(value)


def _integers(low: int | None, high: int | None) -> str:
    """Decimal integers from ``low`` to ``high`` (None: unbounded), without leading zeros."""
    parts = []
    if low is None or low < 0:  # the negatives: "-" and a magnitude from 1 up
        top = None if low is None else -low
        bottom = 1 if high is None or high >= 0 else -high
        parts.append(f'"-" ({_naturals(bottom, top)})')
    if high is None or high >= 0:
        parts.append(_naturals(max(low or 0, 0), high))
    return " | ".join(parts)


UNBOUNDED_DIGITS = 16
"""An integer with no upper bound is written with at most this many digits."""


def _naturals(low: int, high: int | None) -> str:
    """Decimal integers from ``low`` >= 0 to ``high`` (None: up to UNBOUNDED_DIGITS digits)."""
    options = ['"0"'] if low == 0 else []
    low = max(low, 1)
    top = 10 ** len(str(low)) - 1 if high is None else high
    for digits in range(len(str(low)), len(str(top)) + 1):  # by length: no leading zeros
        a, b = max(low, 10 ** (digits - 1)), min(top, 10**digits - 1)
        if a <= b:
            options.append(_same_length(str(a), str(b)))
    if high is None and len(str(low)) < UNBOUNDED_DIGITS:  # every longer number
        options.append(f"[1-9] [0-9]{{{len(str(low))},{UNBOUNDED_DIGITS - 1}}}")
    return " | ".join(options)


def _same_length(a: str, b: str) -> str:
    """The numbers from ``a`` to ``b``, both of the same number of digits."""
    if not a:
        return '""'
    if a == b:
        return f'"{a}"'
    rest = len(a) - 1
    if a == "0" * len(a) and b == "9" * len(b):
        return f"[0-9]{{{len(a)}}}"
    if a == "1" + "0" * rest and b == "9" * len(b):
        return f"[1-9] [0-9]{{{rest}}}" if rest else "[1-9]"
    if a[0] == b[0]:
        return f'"{a[0]}" ({_same_length(a[1:], b[1:])})'
    options = [f'"{a[0]}" ({_same_length(a[1:], "9" * rest)})' if rest else f'"{a[0]}"']
    if int(b[0]) - int(a[0]) > 1:
        middle = f"[{int(a[0]) + 1}-{int(b[0]) - 1}]"
        options.append(f"{middle} [0-9]{{{rest}}}" if rest else middle)
    options.append(f'"{b[0]}" ({_same_length("0" * rest, b[1:])})' if rest else f'"{b[0]}"')
    return " | ".join(options)


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str,
           to_int: Callable[[float], int], step: int) -> int | None:
    value, key = schema.get(inclusive), inclusive
    if value is None and schema.get(exclusive) is not None:
        value, key = schema[exclusive], exclusive
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"'{key}' must be a number")
    bound = to_int(value)
    if key == exclusive and bound == value:
        bound += step
    return bound

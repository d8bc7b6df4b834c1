"""Chat templates of thinking families, for tests (the starter's Gemma 3 template does not
think): Qwen3's structure (``enable_thinking``; the model opens ``<think>`` itself) and the
DeepSeek-R1 distills' (the prompt opens ``<think>``; no switch); and Qwen 2.5's tools template
with Qwen3's thinking switch, which thinks and calls tools."""

from pathlib import Path

QWEN3_STYLE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\n\n</think>\n\n' }}{%- endif -%}{%- endif -%}"
)

R1_STYLE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{ '<｜User｜>' + message['content'] }}"
    "{%- else -%}{{ '<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<｜Assistant｜><think>\n' }}{%- endif -%}"
)

QWEN25 = (Path(__file__).parent / "templates" / "qwen2.5.jinja").read_text()
GENERATION_PROMPT = "{{- '<|im_start|>assistant\\n' }}"
QWEN3_TOOLS = QWEN25.replace(GENERATION_PROMPT, GENERATION_PROMPT + (
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"))
"""Qwen 2.5's template (tools) with Qwen3's ``enable_thinking`` switch."""
QWEN3_REASONING = "The user wants Paris's weather; I have a tool for that."
QWEN3_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

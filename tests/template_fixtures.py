"""Chat templates of thinking families, for tests (the starter's Gemma 3 template does not
think): Qwen3's structure (``enable_thinking``; the model opens ``<think>`` itself), the
DeepSeek-R1 distills' (the prompt opens ``<think>``; no switch), and a Qwen3-style one that
takes tools (Qwen2.5's tool template plus Qwen3's thinking switch)."""

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

"""localinfer: a local LLM inference runtime for consumer hardware.

It picks the model size and quantization that fits the machine, runs it with llama.cpp, and
shows how fast it goes and why, in a terminal chat and through an OpenAI/Ollama-compatible
daemon that editor plugins can use.
"""

__version__ = "0.1.0"

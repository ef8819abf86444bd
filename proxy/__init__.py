"""SmartCache: a multi-turn semantic cache proxy for OpenAI-compatible endpoints."""

__version__ = "0.1.0"

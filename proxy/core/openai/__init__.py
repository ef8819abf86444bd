"""OpenAI wire format: request parsing, response and SSE builders, the SSE tee (pure)."""

"""SmartCache with the official openai SDK: only the base URL changes.

    export OPENAI_BASE_URL=http://127.0.0.1:8080/v1
    python examples/openai_sdk.py

Asks a question, then a paraphrase of it (streamed), and prints each answer with the cache's
response headers. A fresh answer becomes reusable after the feedback window (`--ready-after`,
60 s by default): start the proxy with `smartcache serve --ready-after 0` (or run
`smartcache demo`) to see the paraphrase hit at once.
"""

from __future__ import annotations

import os
import uuid

from openai import OpenAI

QUESTION = "Give me three tips for sleeping better."
PARAPHRASE = "give me 3 tips for sleeping better"


def cache_headers(headers: object) -> str:
    names = ("x-cache-status", "x-cache-similarity", "x-cache-id", "age")
    return " ".join(f"{name}={headers.get(name)}" for name in names if headers.get(name))  # type: ignore[attr-defined]


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"),
        api_key=os.environ.get("OPENAI_API_KEY", "sk-local"),  # its hash is the tenant: keys never share answers
        # one conversation = one session; without the header SmartCache derives one from the messages
        default_headers={"x-smartcache-session": f"example-{uuid.uuid4().hex[:8]}"},
    )
    model = os.environ.get("MODEL") or client.models.list().data[0].id  # /v1/models passes through

    raw = client.chat.completions.with_raw_response.create(
        model=model, max_tokens=192, messages=[{"role": "user", "content": QUESTION}]
    )
    print(f"[not streamed] {cache_headers(raw.headers)}")
    print(raw.parse().choices[0].message.content)

    with client.chat.completions.with_streaming_response.create(
        model=model, max_tokens=192, stream=True, messages=[{"role": "user", "content": PARAPHRASE}]
    ) as response:
        print(f"\n[streamed] {cache_headers(response.headers)}")  # headers arrive before the first chunk
        for chunk in response.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
    print()


if __name__ == "__main__":
    main()

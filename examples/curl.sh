#!/usr/bin/env bash
# SmartCache with curl: ask, ask again in other words (streamed), then skip the cache once.
# The cache's verdict is in the response headers (x-cache-status, x-cache-similarity, ...).
#
#   OPENAI_BASE_URL=http://127.0.0.1:8080/v1 bash examples/curl.sh
#
# A fresh answer becomes reusable after the feedback window (--ready-after, 60 s by default):
# start the proxy with `smartcache serve --ready-after 0` to see the second ask hit at once.
set -euo pipefail

BASE=${OPENAI_BASE_URL:-http://127.0.0.1:8080/v1}
KEY=${OPENAI_API_KEY:-sk-local}
SESSION=${SESSION:-curl-$$}
MODEL=${MODEL:-$(curl -fsS "$BASE/models" -H "Authorization: Bearer $KEY" |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')}

# ask QUESTION true|false [extra curl args...]: the cache's headers, then the answer as it arrives
ask() {
  local question=$1 stream=$2
  shift 2
  printf '\n>>> %s (stream=%s)\n' "$question" "$stream"
  curl -fsS -N -i "$BASE/chat/completions" \
    -H "Authorization: Bearer $KEY" \
    -H "Content-Type: application/json" \
    -H "x-smartcache-session: $SESSION" \
    "$@" \
    -d "{\"model\": \"$MODEL\", \"max_tokens\": 192, \"stream\": $stream,
         \"messages\": [{\"role\": \"user\", \"content\": \"$question\"}]}" |
    awk -v head=1 'head && /^\r?$/ { head = 0; next }
         head { if (tolower($0) ~ /^(x-cache-|x-smartcache-|age:)/) print; next }
         { print; fflush() }'
  echo
}

ask "Give me three tips for sleeping better." false
ask "give me 3 tips for sleeping better" true
# per-request controls: skip the lookup for this request (the answer is still stored)
ask "Give me three tips for sleeping better!" false -H "Cache-Control: no-cache"

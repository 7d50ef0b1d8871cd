# syntax=docker/dockerfile:1
# Owns the container image of nodecompute: a build stage that compiles the TypeScript, and a runtime
# stage with production dependencies and dist/ only, running as an unprivileged user. What the
# service relies on here (the port, the state file's directory, the /livez route, the settings'
# environment names) is checked by test/deploy/dockerfile.test.ts, because `docker build` cannot run
# in CI.
#
# Run it on a GPU node (the NVIDIA Container Toolkit injects a glibc nvidia-smi, hence a glibc base):
#   docker build --build-arg VERSION="$(node -p "require('./package.json').version")" -t nodecompute .
#   mkdir -p secrets && openssl rand -hex 32 > secrets/token && sudo chown -R 10001 secrets && sudo chmod 400 secrets/token
#   docker run -d --name nodecompute --runtime=nvidia --gpus all --pid=host --init \
#     -p 9470:9470 -v nodecompute-state:/var/lib/nodecompute \
#     -v "$PWD/secrets:/run/secrets/nodecompute:ro" -e NODECOMPUTE_TOKEN_FILE=/run/secrets/nodecompute/token nodecompute
#   docker exec nodecompute nodecompute doctor
# The token is needed even on a single host: through -p, a write from the host reaches the container
# from the bridge's address (172.17.0.1), not from loopback, and without a token only loopback may
# write. The directory is mounted, not the file: a bind-mounted file keeps its inode, so a token
# replaced with a rename (mv secrets/token.new secrets/token) would never reach the container.
# --pid=host is required: nvidia-smi reports host PIDs, and without the host's PID namespace
# nodecompute cannot tell whose GPU memory is whose (doctor and /readyz say so). --init reaps
# orphans when node is PID 1; under --pid=host (or hostPID in Kubernetes) the host's init does.

ARG NODE_IMAGE=node:24-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN --mount=type=cache,target=/root/.npm npm ci --no-audit --no-fund
COPY . .
RUN npm run build

FROM ${NODE_IMAGE} AS runtime
ARG NODE_IMAGE
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="nodecompute" \
      org.opencontainers.image.description="Where GPU work really runs on a node: which GPUs each LLM shard holds, foreign GPU memory, readiness probes that catch silent CPU fallback." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${NODE_IMAGE}"

# UID 10001, not the image's `node` user (1000): with the host PID namespace, a process can signal
# every host process that runs under its own UID, and 1000 is often a real user on the host.
# No capability is needed for the work itself: /proc/PID/stat and /proc/PID/cgroup of other users'
# processes are world-readable (unless the host mounts /proc with hidepid), and nvidia-smi only
# needs the device nodes the NVIDIA runtime injects. The state directory is created here owned by
# that user, so a named volume starts out writable; a bind mount or hostPath keeps the host's
# ownership and must be chowned to 10001 (the Kubernetes DaemonSet does it in an initContainer).
RUN groupadd --system --gid 10001 nodecompute \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nodecompute \
 && mkdir -p /var/lib/nodecompute \
 && chown 10001:10001 /var/lib/nodecompute \
 && chmod 0700 /var/lib/nodecompute

ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
RUN --mount=type=cache,target=/root/.npm npm ci --omit=dev --ignore-scripts --no-audit --no-fund
COPY --from=build /app/dist ./dist
# `nodecompute` on PATH, as package.json's bin installs it, so that the `nodecompute doctor` the
# service's messages recommend runs in the container as they say (docker exec or kubectl exec).
# main.js starts with #!/usr/bin/env node; the NODE_OPTIONS below apply to it as to the service.
RUN chmod 0755 /app/dist/src/main.js \
 && ln -s /app/dist/src/main.js /usr/local/bin/nodecompute

ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    NODECOMPUTE_STATE_FILE=/var/lib/nodecompute/shards.json

# The heap the service needs is ~25 MiB live; without a cap V8 lets garbage grow it past 150 MiB of
# RSS before collecting. Same value as package.json's config.nodeOptions (a test keeps them equal).
# `docker run -e NODE_OPTIONS=...` replaces the whole variable: repeat these flags in it to keep the cap.
ENV NODE_OPTIONS="--max-old-space-size=128 --max-semi-space-size=2"

# glibc's malloc gives threads that allocate at once arenas of their own (up to 8 per core), and what
# they free stays resident in them. With two arenas RSS was lower in 6 of 6 paired runs of the
# memory benchmark, by 2.5 to 8.6 MB (Node 20 and 24; bench/README.md). Same value as package.json's
# config.mallocArenaMax (a test keeps them equal).
ENV MALLOC_ARENA_MAX=2

# NVML calls (koffi's .async), the state file and reads of /proc/PID/maps all run on libuv's thread
# pool. A wedged driver can hold a thread per NVML query and the maps reads of processes stuck in it
# two more: with the default 4 the state file would wait behind them and read as a hung volume.
# Same value as package.json's config.uvThreadpoolSize (a test keeps them equal).
ENV UV_THREADPOOL_SIZE=8

USER 10001:10001
EXPOSE 9470
VOLUME /var/lib/nodecompute

# slim has no curl: node itself asks /livez, which never depends on nvidia-smi. It follows
# NODECOMPUTE_PORT; it assumes the service listens on IPv4 loopback too (the default host :: does,
# IPv4 included; so does the 0.0.0.0 it falls back to on a kernel without IPv6).
HEALTHCHECK --interval=30s --timeout=3s --start-period=10s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:'+(process.env.NODECOMPUTE_PORT||9470)+'/livez').then(r=>process.exit(r.ok?0:1)).catch(()=>process.exit(1))"]

ENTRYPOINT ["node", "/app/dist/src/main.js"]
CMD ["serve"]

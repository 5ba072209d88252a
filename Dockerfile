# gpusched: the image of every component (scheduler, extender, webhook: `gpusched ...`; the node agent:
# `python -m gpusched.cli agent`), for those who build with Docker and push to a registry:
#   docker build -t ghcr.io/gpusched/gpusched:0.1.0 .
#   docker run --rm ghcr.io/gpusched/gpusched:0.1.0 --help
# Without Docker or a registry, hack/build-image.sh builds the equivalent image (the same wheel and pinned
# dependencies, entry point, user, environment and ports, on Debian bookworm's own python3) as an OCI archive;
# deploy/README.md ("The image") says how to load either into a cluster. Neither is published.
# Runs as an unprivileged user (10001) and works with a read-only root filesystem (only /tmp must be writable).

# --- build: a wheel of gpusched -------------------------------------------------------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-deps --wheel-dir /dist .

# --- runtime ---------------------------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    # matplotlib (used by the simulator's reports) wants a writable config dir.
    MPLCONFIGDIR=/tmp/matplotlib
# The runtime dependencies are pinned (==) in pyproject.toml, so the wheel installs the same versions every time.
COPY --from=build /dist/*.whl /tmp/wheels/
RUN python -m pip install /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && groupadd --system --gid 10001 gpusched \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin gpusched
USER 10001:10001
WORKDIR /tmp
# The standalone scheduler's /healthz, /readyz, /metrics; the extender.
EXPOSE 8080 8888
ENTRYPOINT ["gpusched"]
CMD ["--help"]

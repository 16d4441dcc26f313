# One image for both programs: `raftgate store …`, `raftgate proxy …` (and `raftgate bootstrap-auth …`).
#
#   docker build -t raftgate:0.1.0 .
#   docker run --rm raftgate:0.1.0 proxy --help
#
# The builder installs raftgate and its dependencies from pyproject.toml into a virtual environment;
# the final stage gets only that environment, on the same base image, and runs as an unprivileged user.
# All dependencies ship manylinux wheels for CPython 3.11, so no compiler is needed in either stage.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
RUN python -m venv /opt/raftgate
COPY pyproject.toml README.md ./
COPY protos/ protos/
COPY proxy/ proxy/
COPY authstore/ authstore/
COPY raftgate/ raftgate/
COPY bench/ bench/
# A regular (not editable) install, then drop the installers: the final venv only runs raftgate.
RUN /opt/raftgate/bin/pip install --no-cache-dir . \
    && /opt/raftgate/bin/pip uninstall --yes pip setuptools \
    && /opt/raftgate/bin/raftgate --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="raftgate" \
      org.opencontainers.image.description="etcd v3 compatible auth proxy and replicated store" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 raftgate \
    && useradd --system --uid 10001 --gid raftgate --home-dir /var/lib/raftgate \
       --no-create-home --shell /usr/sbin/nologin raftgate \
    && mkdir -p /var/lib/raftgate \
    && chown 10001:10001 /var/lib/raftgate
COPY --from=builder /opt/raftgate /opt/raftgate
ENV PATH=/opt/raftgate/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/raftgate
# 2379 etcd v3 API (proxy) · 23790 internal (store) · 2380 peer (store) · 9090 metrics · 9091 gRPC health
EXPOSE 2379 2380 23790 9090 9091
USER 10001:10001
ENTRYPOINT ["raftgate"]
CMD ["--help"]

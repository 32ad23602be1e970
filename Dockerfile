# The airgossip image: coordinator and agent, `airgossip` as the entry point.
#
#   docker build -t airgossip:latest .                 # python:3.11-slim, CPU build of torch
#   deploy/docker/build                                # machines without an image registry
#
# Build arguments:
#   BASE_IMAGE       a Debian-like image with Python >= 3.11 and `python3 -m venv`
#   TORCH            the torch requirement (default: the lock's pin, the CPU build)
#   TORCH_INDEX_URL  where torch comes from (default: PyTorch's CPU index; empty: the
#                    default index, e.g. for a GPU or aarch64 build from PyPI)
# Everything else comes from requirements/runtime.lock, hashes checked, nothing resolved anew.
# Wheels and a CA bundle put in deploy/docker/extra/ are used by pip when present (see its
# README). The image runs as the unprivileged user `airgossip`; an agent that shapes its
# own links in the kernel runs as root with NET_ADMIN (docs/deployment.md).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
ARG TORCH=
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PATH=/opt/airgossip/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
COPY deploy/docker/extra/ /tmp/extra/
# pip of the venv reads /opt/airgossip/pip.conf (removed at the end of this stage).
RUN set -eu; python3 -m venv /opt/airgossip; \
    { echo "[global]"; \
      if [ -f /tmp/extra/ca.crt ]; then echo "cert = /tmp/extra/ca.crt"; fi; \
      if ls /tmp/extra/wheels/*.whl >/dev/null 2>&1; then echo "find-links = /tmp/extra/wheels"; fi; \
    } > /opt/airgossip/pip.conf
# torch first, on its own layer: the largest download, and it changes least. Its C++
# headers and CMake files serve extension builds only.
COPY requirements/runtime.lock /src/requirements/
RUN set -eu; \
    torch="${TORCH:-$(grep -oE '^torch==[^ ]+' /src/requirements/runtime.lock)}"; \
    if [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" "$torch"; \
    else pip install "$torch"; fi; \
    site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"; \
    rm -rf "$site/torch/include" "$site/torch/share/cmake"
# Then the dependencies from the lock (a layer kept while only the code changes), torch's
# entry left out (installed above, from its own index), then the code, built with the lock's
# setuptools (no isolated build fetching another).
RUN python -c 'import re, sys; sys.stdout.write(re.sub(r"(?ms)^torch==.*?(?=^\S)", "", open(sys.argv[1]).read()))' \
        /src/requirements/runtime.lock > /tmp/requirements.txt \
    && pip install --require-hashes --no-deps -r /tmp/requirements.txt && pip check
COPY pyproject.toml README.md /src/
COPY protos /src/protos
COPY edge /src/edge
COPY coordinator /src/coordinator
COPY emulation /src/emulation
COPY airgossip /src/airgossip
RUN pip install --no-deps --no-build-isolation /src && rm -rf /src/build /opt/airgossip/pip.conf

FROM ${BASE_IMAGE}
ENV PATH=/opt/airgossip/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1
# The kernel link applier's tools (a base image made with deploy/docker/build has them).
RUN set -eu; missing=""; \
    for pair in ip:iproute2 tc:iproute2 iptables:iptables ethtool:ethtool; do \
        command -v "${pair%%:*}" >/dev/null 2>&1 || missing="$missing ${pair#*:}"; \
    done; \
    if [ -n "$missing" ]; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing \
        && rm -rf /var/lib/apt/lists/*; \
    fi; \
    useradd --system --uid 10001 --user-group --home-dir /var/lib/airgossip --create-home airgossip; \
    mkdir -p /var/lib/airgossip/claims /var/lib/airgossip/data /var/lib/airgossip/certs \
        /var/lib/airgossip/checkpoints /var/lib/airgossip/ca; \
    chown -R airgossip:airgossip /var/lib/airgossip
COPY --from=build /opt/airgossip /opt/airgossip
COPY deploy/docker/entrypoint.sh /usr/local/bin/airgossip-entrypoint
COPY deploy/docker/healthcheck.py deploy/docker/fleet_certs.py /usr/local/lib/airgossip/
LABEL org.opencontainers.image.title="airgossip" \
      org.opencontainers.image.description="Decentralized learning over directed, lossy links: gossip agents and their coordinator" \
      org.opencontainers.image.licenses="Apache-2.0"
USER airgossip
WORKDIR /var/lib/airgossip
# 7000 gossip (agent), 9100 agent metrics, 7070 coordinator gRPC, 9470 coordinator HTTP.
EXPOSE 7000 7070 9100 9470
# The gRPC health service of whichever runs here (AIRGOSSIP_HEALTH_ADDRESS; 7000: an agent),
# over mutual TLS with the member's own certificate where it has one (healthcheck.py).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/usr/local/lib/airgossip/healthcheck.py"]
ENTRYPOINT ["airgossip-entrypoint"]
CMD ["--help"]

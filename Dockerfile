# The apportion image: scheduler, worker and operator in one. Pods always run an explicit
# command (`apportion scheduler ...`, `apportion worker ...`, `apportion operator ...`), so
# nothing relies on an entrypoint.
#
#   docker build -t apportion:0.1.0 .
#
# BASE_IMAGE exists for machines that cannot pull it (`make image` then builds a Debian
# stand-in with the same Python); everyone else builds on python:3.11-slim.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . /src
# The kubernetes extra (kopf, kubernetes) is what `apportion operator` needs.
# APPORTION_COMPILE=1 compiles the scheduler's state machine with mypyc (setup.py). pip puts
# mypy into its throwaway build environment; the C compiler is removed in the same layer.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && APPORTION_COMPILE=1 pip install --no-cache-dir ".[kubernetes]" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* /src

# Non-root, with a fixed UID/GID the Helm chart's securityContext (runAsUser 10001) expects.
RUN groupadd --system --gid 10001 apportion \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/apportion --create-home \
       --shell /usr/sbin/nologin apportion
USER 10001:10001
WORKDIR /home/apportion

# Scheduler TCP port and its HTTP status port.
EXPOSE 8786 8787

ENTRYPOINT []
CMD ["apportion", "--help"]

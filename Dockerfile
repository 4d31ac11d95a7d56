# One image for every Open-AutoGLM component (ghcr.io/open-autoglm/open-autoglm):
#   autoglm-exporter, autoglm-predictor, autoglm-autoscaler, autoglm-batcher, autoglm-job, autoglm.
# The chart picks the command per component. Build:  docker build -t open-autoglm:dev .
#
# torch is the CPU build: the predictor and autoscaler need no GPU and the exporter reads NVML
# through the library the NVIDIA container toolkit injects at run time. For the batcher on GPUs,
# build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 (or your CUDA).
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/autoglm
ENV PATH=/opt/autoglm/bin:$PATH
# torch first, from its own index, so the project's "torch>=..." is already met by the CPU wheel.
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autoglm ./autoglm
COPY exporter ./exporter
COPY predictor ./predictor
COPY autoscaler ./autoscaler
COPY batcher ./batcher
COPY jobs ./jobs
COPY dashboards ./dashboards
COPY alerts ./alerts
COPY stack ./stack
RUN pip install .

FROM python:${PYTHON_VERSION}-slim
LABEL org.opencontainers.image.source="https://github.com/open-autoglm/open-autoglm" \
      org.opencontainers.image.description="Open-AutoGLM: GPU exporter, forecasts, predictive autoscaler, batching runtime" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/autoglm /opt/autoglm
# A fixed non-root user (the chart runs pods as 65532); the exporter DaemonSet overrides it with
# uid 0 only to reach the kubelet's root-owned pod-resources socket (see the chart's values).
RUN groupadd --gid 65532 autoglm && useradd --uid 65532 --gid 65532 --no-create-home \
        --home-dir /tmp --shell /usr/sbin/nologin autoglm
# The root filesystem is read-only in the chart: nothing may write outside /tmp (an emptyDir).
ENV PATH=/opt/autoglm/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MPLCONFIGDIR=/tmp/matplotlib \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor
USER 65532:65532
WORKDIR /tmp
EXPOSE 9400 9401 9402 8000
CMD ["autoglm", "--help"]

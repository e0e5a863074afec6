# setflow: one image for the API (`setflow serve`, the default command) and the workers
# (`setflow worker`). Configuration comes only from environment variables (runtime/settings.py).
#
#   docker build -t setflow:cpu .                                              # CPU torch (default)
#   docker build -t setflow:gpu --build-arg TORCH_INDEX=https://pypi.org/simple .   # CUDA torch
#   docker build -t setflow:flower --target flower .                           # + Flower
#
# TORCH_INDEX is the index torch==2.13.0 is taken from: the CPU build by default; PyPI's Linux
# wheel is a CUDA build, or name a download.pytorch.org/whl/cuXYZ index matching the host driver.

FROM python:3.11-slim AS base

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SETFLOW_DATA_DIR=/data

# the PDF export (WeasyPrint) lays out text with Pango and HarfBuzz (its subsetter embeds only the
# glyphs a PDF uses); the slim image has no fonts: DejaVu for Latin, Greek, Cyrillic, Arabic and
# Hebrew, Noto CJK for Chinese, Japanese and Korean names (a name may be in any script)
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpango-1.0-0 libpangoft2-1.0-0 libharfbuzz-subset0 \
      fonts-dejavu-core fonts-noto-cjk \
 && rm -rf /var/lib/apt/lists/*

# torch first, in its own layer: the largest one, and it changes only with TORCH_INDEX.
# `pip install .` then finds torch==2.13.0 satisfied (2.13.0+cpu matches it) and keeps it.
RUN pip install --index-url "$TORCH_INDEX" "torch==2.13.0"

COPY . /src
# the package carries the shipped checkpoint and the web page (pyproject's package data); the
# checks load the model from the installed package (run from /, not /src) and render a chart
# into a PDF, as the export does (its libraries and fonts are there)
RUN pip install /src \
 && cd / \
 && python -c 'from model import shipped; shipped.load()' \
 && python -c 'from runtime.api import exports; assert exports.pdf("<p>\u6771\u4eac</p>" + exports.svg({"mark": "bar", "data": {"values": [{"a": 1}]}, "encoding": {"x": {"field": "a", "type": "quantitative"}}})).startswith(b"%PDF")' \
 && rm -rf /src

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin setflow \
 && mkdir -p /data && chown setflow:setflow /data
WORKDIR /data
USER setflow


# Flower (Celery's monitor) on the setflow app, so that it uses the broker's global key prefix
# (workers/celery_app.py); `docker compose` builds it for its `flower` service.
FROM base AS flower
USER root
RUN pip install "flower==2.2.0"
USER setflow
EXPOSE 5555
CMD ["celery", "-A", "workers.celery_app:app", "flower", "--port=5555"]


# The default target (last stage): the API and the workers.
FROM base AS app
EXPOSE 8000
CMD ["setflow", "serve", "--host", "0.0.0.0", "--port", "8000"]

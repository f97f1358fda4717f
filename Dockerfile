# kerasdist on CPU: the image every replica of `kerasdist export tfjob` runs.
#   docker build -t kerasdist:0.2.0 .
# TensorFlow, Keras and the other dependencies come from the package index (pip), as on a
# workstation; the tag is the package version, which `kerasdist export tfjob --image` defaults to.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

# A fixed non-root user; the TFJob pods run as this uid (runAsUser/fsGroup 1000), so a mounted
# run-directory volume is writable by it.
RUN groupadd --gid 1000 kerasdist \
 && useradd --uid 1000 --gid 1000 --create-home --shell /usr/sbin/nologin kerasdist

WORKDIR /opt/kerasdist
COPY pyproject.toml README.md LICENSE ./
COPY kerasdist ./kerasdist
COPY legacy ./legacy
RUN pip install --no-cache-dir . \
 && python -c "import kerasdist, tensorflow, keras; print('kerasdist', kerasdist.__version__)"
COPY recipes ./recipes

# Relative run directories (recipes default to runs/...) and the TFJob's shared mount point.
RUN mkdir -p /opt/kerasdist/runs /kerasdist-runs \
 && chown kerasdist:kerasdist /opt/kerasdist/runs /kerasdist-runs

USER kerasdist
CMD ["kerasdist", "--help"]

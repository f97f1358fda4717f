#!/usr/bin/env bash
# The README's clone quickstart on one Python, logged for `tools/supported_versions.py --quickstart`
# (the Python table of docs/architecture.md#supported-versions): a fresh venv, `pip install -e
# ".[test]"`, then `kerasdist fit recipes/mnist_cnn.yaml` (extra arguments go to the fit).
#
#   bash tools/quickstart_python.sh python3.12 /work/venv-py312 docs/version-runs/DATE/py3.12.quickstart.log
#
# The log's `quickstart:` lines (the Python, install and fit exit codes and wall times, the
# TensorFlow and Keras installed) and the fit's summary are what the table reads.
set -uo pipefail
py="$1" venv="$2" log="$3"
shift 3
cd "$(dirname "$0")/.."
mkdir -p "$(dirname "$log")"
{
  echo "quickstart: $("$py" --version 2>&1) ($py) at $(git describe --always --dirty) on $(date -u +%F)"
  start=$(date +%s)
  "$py" -m venv "$venv" && "$venv/bin/python" -m pip install --quiet --upgrade pip \
    && "$venv/bin/python" -m pip install --quiet -e ".[test]"
  rc=$?
  echo "quickstart: install rc $rc in $(($(date +%s) - start)) s"
  if [ "$rc" -eq 0 ]; then
    TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -c \
      "import tensorflow as tf, keras; print('quickstart: tensorflow', tf.__version__, 'keras', keras.__version__)"
    start=$(date +%s)
    "$venv/bin/kerasdist" fit recipes/mnist_cnn.yaml --overwrite \
      --set "output.run_dir=runs/quickstart-$(basename "$venv")" "$@"
    echo "quickstart: fit rc $? in $(($(date +%s) - start)) s"
  fi
} 2>&1 | grep -v "^WARNING: Location 'file:" | tee "$log"

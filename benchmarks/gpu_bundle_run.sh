#!/usr/bin/env bash
# run.sh of a GPU check bundle (`make gpu-bundle`, benchmarks/gpu_bundle.py): the GPU check on a host
# with Python and an NVIDIA driver, installed from this folder alone (pip --no-index) into two
# temporary environments, nothing downloaded. Writes OUT_DIR/gpu_check.json and OUT_DIR/log.txt.
#
#   bash run.sh [--cpu] [--python PYTHON] [--keep] OUT_DIR [-- CHECK_ARGS...]
#
#   --cpu       rehearse on the CPU (no driver needed): the check's --cpu, served rows with KIND_CPU
#   --python    the host's Python (default: python3 on PATH); with a torch bundle it needs no packages,
#               else its torch (and its NVIDIA libraries) are used: its site-packages come after the
#               bundle's own in each environment
#   --keep      keep the temporary environments (their folder is printed)
#   CHECK_ARGS  more options of python -m benchmarks.gpu_check (such as --source NAME=DIR)
#
# Exit codes: 0 the check passed; 1 a row is outside its gates (the check's own); 2 usage;
# 3 the bundle is for another Python or platform; 4 a part is missing; 5 a part's checksum differs;
# 6 no NVIDIA driver (without --cpu); 7 the environments could not be made from the bundle.
# Each refusal is one line on stderr.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
refuse() { local code=$1; shift; echo "run.sh: $*" >&2; exit "$code"; }

cpu=""; keep=""; python=python3; out=""; extra=()
while (($#)); do
    case $1 in
        --cpu) cpu=1 ;;
        --keep) keep=1 ;;
        --python) (($# >= 2)) || refuse 2 "--python needs a value"; python=$2; shift ;;
        --python=*) python=${1#--python=} ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) refuse 2 "unknown option $1 (usage: run.sh [--cpu] [--python PYTHON] [--keep] OUT_DIR [-- CHECK_ARGS])" ;;
        *) [[ -z $out ]] || refuse 2 "one OUT_DIR only (got $out and $1)"; out=$1 ;;
    esac
    shift
done
[[ -n $out ]] || refuse 2 "usage: run.sh [--cpu] [--python PYTHON] [--keep] OUT_DIR [-- CHECK_ARGS]"
[[ -f $HERE/bundle.env && -f $HERE/SHA256SUMS ]] \
    || refuse 4 "no bundle.env and SHA256SUMS beside run.sh in $HERE: copy the whole bundle folder"
# shellcheck source=/dev/null
. "$HERE/bundle.env"

# 3: the Python and the platform the bundle's wheels and libpython were built for.
PY=$(command -v "$python") || refuse 3 "no $python on this host: the bundle is for Python $BUNDLE_PYTHON (--python PATH)"
have=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || refuse 3 "$PY does not run: the bundle is for Python $BUNDLE_PYTHON"
[[ $have == "$BUNDLE_PYTHON" ]] || refuse 3 "this bundle is for Python $BUNDLE_PYTHON and $PY is Python $have: build one" \
    "with make gpu-bundle PYTHON=$have (3.11 or 3.12: numpy 1.26, which the stub needs, has no wheels after 3.12)"
machine=$(uname -m)
[[ $machine == "$BUNDLE_MACHINE" ]] || refuse 3 "this bundle is for $BUNDLE_MACHINE and this host is $machine"
glibc=$("$PY" -c 'import os; print(os.confstr("CS_GNU_LIBC_VERSION").split()[1])' 2>/dev/null) \
    || refuse 3 "this host's C library is not glibc: the bundle's wheels need glibc $BUNDLE_GLIBC or newer"
"$PY" -c 'import sys; v = lambda s: tuple(map(int, s.split("."))); sys.exit(v(sys.argv[1]) < v(sys.argv[2]))' \
    "$glibc" "$BUNDLE_GLIBC" || refuse 3 "this host has glibc $glibc and the bundle needs $BUNDLE_GLIBC or newer"

# 6: a driver, unless rehearsing on the CPU.
if [[ -z $cpu ]] && ! nvidia-smi -L >/dev/null 2>&1; then
    refuse 6 "no NVIDIA driver here (nvidia-smi -L fails or is not on PATH): run it on a GPU host, or rehearse with --cpu"
fi

# 4 and 5: every part, each as SHA256SUMS lists it.
parts=(); sums=()
while read -r sum file; do
    [[ -n ${file:-} ]] || continue
    parts+=("$file"); sums+=("$sum")
done < "$HERE/SHA256SUMS"
((${#parts[@]})) || refuse 4 "SHA256SUMS in $HERE lists no part"
for i in "${!parts[@]}"; do
    [[ -f $HERE/${parts[i]} ]] || refuse 4 "missing part ${parts[i]} ($((i + 1)) of ${#parts[@]} listed in SHA256SUMS): copy every part beside run.sh"
done
for i in "${!parts[@]}"; do
    got=$("$PY" -c 'import hashlib, sys
digest = hashlib.sha256()
with open(sys.argv[1], "rb") as file:
    for chunk in iter(lambda: file.read(1 << 20), b""):
        digest.update(chunk)
print(digest.hexdigest())' "$HERE/${parts[i]}")
    [[ $got == "${sums[i]}" ]] || refuse 5 "part ${parts[i]} has sha256 $got, SHA256SUMS says ${sums[i]}: copy it again"
done

mkdir -p "$out" || refuse 2 "cannot make $out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bundle.XXXXXX") || refuse 7 "cannot make a temporary folder"
# shellcheck disable=SC2317  # called by the trap
cleanup() { if [[ -n $keep ]]; then echo "run.sh: kept $work" >&2; else rm -rf "$work"; fi; }
trap cleanup EXIT

main() {
    local site_check site_triton host_sites status
    echo "== host"
    echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'), glibc $glibc, $(uname -srm))"
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "driver: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
        echo "CUDA (the driver's): $(nvidia-smi | grep -o 'CUDA Version: *[0-9.]*' | head -1 | sed 's/.*: *//')"
    else
        echo "driver: none (--cpu)"
    fi
    echo "bundle: Python $BUNDLE_PYTHON, glibc $BUNDLE_GLIBC+, torch: $BUNDLE_TORCH, CUDA libraries: $BUNDLE_CUDA_LIBS (${#parts[@]} part(s))"

    # The archive, reassembled in SHA256SUMS' order, unpacked with Python's lzma (no xz needed).
    (cd "$HERE" && cat "${parts[@]}") | "$PY" -c 'import sys, tarfile
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extraction_filter = tarfile.data_filter
    tar.extractall(sys.argv[1])' "$work" || { echo "run.sh: the archive could not be unpacked"; return 7; }
    local bundle=$work/bundle
    local pip=("$bundle/wheels/"pip-*.whl)

    # Two environments: the check's (numpy 2) and the triton one (numpy 1.26, tritonserver).
    host_sites=$("$PY" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))')
    for env in check triton; do
        "$PY" -m venv --without-pip "$work/$env" || { echo "run.sh: $PY -m venv failed"; return 7; }
        local site
        site=$("$work/$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        if [[ -s $bundle/$env.txt ]]; then
            PIP_CONFIG_FILE=/dev/null "$work/$env/bin/python" "${pip[0]}/pip" install --isolated --no-index \
                --find-links "$bundle/wheels" --no-deps --no-compile --quiet --disable-pip-version-check \
                -r "$bundle/$env.txt" || { echo "run.sh: installing the $env environment from the bundle failed"; return 7; }
        fi
        if [[ $BUNDLE_TORCH == host ]]; then  # the host's torch, after the bundle's own packages
            while read -r dir; do
                [[ -n $dir ]] && printf 'import site; site.addsitedir(%s)\n' "$("$PY" -c 'import sys; print(repr(sys.argv[1]))' "$dir")"
            done <<< "$host_sites" > "$site/zz_host_site_packages.pth"
        fi
        [[ $env == check ]] && site_check=$site || site_triton=$site
    done
    echo "$bundle/project" > "$site_check/triton_mme_cdk_bundle.pth"

    # The CUDA and cuDNN libraries onnxruntime-gpu preloads from nvidia/ beside onnxruntime/.
    echo "== CUDA libraries"
    if [[ -d $site_triton/nvidia ]]; then
        echo "the bundle's NVIDIA wheels (CUDA_LIBS=bundle)"
    else
        local nvidia
        nvidia=$("$work/check/bin/python" -c 'import os, sys
for path in sys.path:
    folder = os.path.join(path, "nvidia")
    if os.path.isdir(folder) and any(os.path.isdir(os.path.join(folder, n)) for n in ("cublas", "cu13", "cu12", "cudnn")):
        print(folder); break' 2>/dev/null)
        if [[ -n $nvidia ]]; then
            ln -s "$nvidia" "$site_check/nvidia"; ln -s "$nvidia" "$site_triton/nvidia"
            echo "the host's NVIDIA packages (its torch's): $nvidia, linked beside each environment's onnxruntime"
        else  # what the loader finds of what onnxruntime-gpu's CUDA provider links
            (cd "$work" && "$work/check/bin/python" - <<'PY'
import ctypes

try:
    from onnxruntime.capi.build_and_package_info import cuda_version
except ImportError:
    cuda_version = "13"
major = (cuda_version or "13").split(".")[0]
found, missing = [], []
for name in (f"libcudart.so.{major}", f"libcublasLt.so.{major}", f"libcublas.so.{major}", "libcudnn.so.9"):
    try:
        ctypes.CDLL(name)
        found.append(name)
    except OSError:
        missing.append(name)
if missing:
    print(f"not all: the loader finds {', '.join(found) or 'none'} and lacks {', '.join(missing)}: the CUDA "
          "provider's rows will say so (make gpu-bundle CUDA_LIBS=bundle carries them)")
else:
    print(f"the system's: the loader finds {', '.join(found)}")
PY
            )
        fi
    fi

    # The stub's libpython: the host's where the loader finds it, else the bundle's.
    echo "== libpython$BUNDLE_PYTHON.so.1.0 (the python backend stub links it)"
    local why
    why=$(cd "$bundle/project" && "$work/check/bin/python" -c 'import sys
from pathlib import Path
from triton_mme_cdk.model_build.tools.local_endpoint.triton_server import TritonEnvironment, TritonEnvironmentError
try:
    print(TritonEnvironment.find(Path(sys.argv[1])).missing_libpython())
except TritonEnvironmentError as error:
    print(f"no tritonserver: {error}")' "$work/triton" 2>&1)
    if [[ -z $why ]]; then
        echo "the host's"
    elif [[ $why == "no tritonserver"* ]]; then
        echo "not needed: $why"
    elif [[ -f $bundle/libpython/libpython$BUNDLE_PYTHON.so.1.0 ]]; then
        export LD_LIBRARY_PATH="$bundle/libpython${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "the bundle's ($("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["libpython"]["from"])' \
            "$bundle/bundle.json")): the host has none"
    else
        echo "none: $why"
    fi

    echo "== what each environment imports"
    for env in check triton; do
        (cd "$work" && "$work/$env/bin/python" - "$env" <<'PY'
import importlib, sys
row = [f"{sys.argv[1]}: Python {sys.version.split()[0]}"]
names = ("numpy", "torch", "onnxruntime") + (("transformers", "triton_mme_cdk") if sys.argv[1] == "check" else ())
for name in names:
    try:
        module = importlib.import_module(name)
    except Exception as error:  # what it lacks is part of the answer
        row.append(f"{name} -- ({type(error).__name__})")
        continue
    where = getattr(module, "__file__", "") or ""
    text = f"{name} {getattr(module, '__version__', '')}".strip()
    if name == "torch":
        text += f" (CUDA {module.version.cuda}, GPU: {module.cuda.is_available()})"
    if name == "onnxruntime":
        text += f" ({', '.join(p.replace('ExecutionProvider', '') for p in module.get_available_providers())})"
    row.append(f"{text} [{where.rsplit('/site-packages/', 1)[0] if '/site-packages/' in where else where}]")
print("\n  ".join(row))
PY
        )
    done

    echo "== the check"
    export MME_TRITON_ENV=$work/triton HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1
    (cd "$bundle/project" && "$work/check/bin/python" -m benchmarks.gpu_check --manifest models.yaml \
        --out "$out/gpu_check.json" ${cpu:+--cpu} "${extra[@]}")
    status=$?
    echo "run.sh: the check exited $status; wrote $out/gpu_check.json and $out/log.txt"
    return "$status"
}

main 2>&1 | tee "$out/log.txt"
exit "${PIPESTATUS[0]}"

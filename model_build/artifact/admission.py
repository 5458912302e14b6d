"""What the placing step admits: a stored tarball tied to its manifest entry, checked without
loading any model file (the placing role parses no graph the build role wrote).

:func:`check_admitted` runs :func:`model_build.artifact.gate.check_repository` with ``load=False``
(layout, configs, version folders, model files present, ensemble wiring), then ties the tarball
to its entry (:class:`~model_build.manifest.ModelSpec`):

1. each folder's backend is the one the entry's ``format`` is served by (``onnx``:
   ``onnxruntime``, ``torchscript``: ``pytorch``, ``tensorrt_plan``: ``tensorrt``); an ensemble
   and a python backend only for a raw-text entry (``inputs: text``), and the python backend only
   in the tokenizer's folder;
2. the python-backend folder holds exactly the files its :class:`PythonModelRule` names: each
   code file byte-identical to the project's (by SHA-256: ``model.py``, the pinned ``tokenizers``
   wheel's files), its data files (``tokenizer.json``) and nothing else;
3. no config names a native library or a path the backend loads from: ``model_operations``
   (custom op libraries), ``model_repository_agents``, an ``EXECUTION_ENV_PATH`` parameter, a
   path-valued TensorRT key (:data:`~model_build.manifest.TENSORRT_PATH_KEYS`);
4. no file outside the rule's code files is a native library (ELF) or a Python file: Triton
   looks for a backend's shared library in the model's own folders first.

Each refusal is a :class:`~model_build.errors.VerifyError` naming the model, the file and what is
allowed. What this cannot know: whether the graph matches its config (the build's gate checked
that under the build role; a graph that does not is refused by Triton at load, and its model
alone fails). The tar and ``config.pbtxt`` readers are the standard library's and protobuf's text
parser, under the unpack limits (:func:`model_build.artifact.tarball.safe_extract`).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from triton_mme_cdk.model_build.artifact.gate import check_repository
from triton_mme_cdk.model_build.artifact.triton_config import ModelConfig, config_backend, parse_config
from triton_mme_cdk.model_build.errors import VerifyError
from triton_mme_cdk.model_build.manifest import TENSORRT_PATH_KEYS, ModelSpec

#: The backend each ``format`` of a manifest entry is served by.
FORMAT_BACKEND: dict[str, str] = {"onnx": "onnxruntime", "torchscript": "pytorch", "tensorrt_plan": "tensorrt"}
#: The first bytes of an ELF file (a Linux shared library or executable).
ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class PythonModelRule:
    """What the one python-backend folder of a raw-text tarball may hold.

    ``folder``: its name; ``version``: its version folder; ``code``: path inside the version
    folder -> the SHA-256 its bytes must have (every one must be there); ``data``: paths whose
    bytes are data the code reads (``tokenizer.json``), which must be there too."""

    folder: str
    version: str
    code: Mapping[str, str]
    data: frozenset[str] = field(default_factory=frozenset)


def check_admitted(path: Path, spec: ModelSpec, *, python_rule: PythonModelRule | None) -> None:
    """Refuse a tarball (``path``: ``model.tar.gz`` or an unpacked folder) that does not belong to
    ``spec`` (see the module's docstring). Unpacks a tarball into a temporary folder beside it.
    ``python_rule``: what the tokenizer folder of a raw-text entry may hold (required for one)."""
    path = Path(path)
    if path.is_file():
        from triton_mme_cdk.model_build.artifact.tarball import safe_extract

        with tempfile.TemporaryDirectory(prefix=".admit-", dir=path.parent) as tmp:
            safe_extract(path, Path(tmp), model=spec.name)
            check_admitted(Path(tmp), spec, python_rule=python_rule)
            return
    check_repository(path, model=spec.name, load=False)
    configs = _configs(path, spec.name)
    text = spec.inputs == "text"
    if text and python_rule is None:
        raise VerifyError(f"model {spec.name!r}: a raw-text entry is admitted only with the tokenizer's rule",
                          model=spec.name)
    expected = FORMAT_BACKEND[spec.format]
    for folder, config in configs.items():
        where = f"model {spec.name!r}: {(folder + '/') if folder else ''}config.pbtxt"
        _check_config_loads_nothing(config, where, spec.name)
        backend = "ensemble" if config.platform == "ensemble" else config_backend(config)
        if backend == "ensemble" and text:
            continue
        if backend == "python" and python_rule is not None and text and folder == python_rule.folder:
            _check_python_folder(path / folder, python_rule, spec.name)
            continue
        if backend != expected:
            allowed = f"{expected!r}" + (", the ensemble and 'python' in the tokenizer's folder (inputs: text)"
                                          if text else "")
            raise VerifyError(f"{where}: backend {backend!r}; the entry (format {spec.format!r}, inputs "
                              f"{spec.inputs!r}) is served by {allowed} only", model=spec.name)
    if text and not any(c.platform == "ensemble" for c in configs.values()):
        raise VerifyError(f"model {spec.name!r}: tarball: no ensemble; a raw-text entry is served as the "
                          "tokenizer ensemble", model=spec.name)
    code = ({f"{python_rule.folder}/{python_rule.version}/{name}" for name in python_rule.code}
            if text and python_rule is not None else set())
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        relative = file.relative_to(path).as_posix()
        if relative in code:
            continue
        with file.open("rb") as handle:
            head = handle.read(len(ELF_MAGIC))
        if head == ELF_MAGIC or file.suffix in (".py", ".pyc", ".so", ".pth"):
            raise VerifyError(f"model {spec.name!r}: file {relative!r}: a native library or Python file outside "
                              "the project's code; allowed there: model files and the configs", model=spec.name)


def _configs(root: Path, model: str) -> dict[str, ModelConfig]:
    """``folder -> config`` of the tarball ("" for a config at the root)."""
    if (root / "config.pbtxt").is_file():
        folders: list[tuple[str, Path]] = [("", root / "config.pbtxt")]
    else:
        folders = [(p.name, p / "config.pbtxt") for p in sorted(root.iterdir()) if p.is_dir()]
    return {name: parse_config(file.read_text(encoding="utf-8", errors="replace"), model=model)
            for name, file in folders}


def _check_config_loads_nothing(config: ModelConfig, where: str, model: str) -> None:
    """No config field that makes Triton or a backend load a library or read a path it names."""
    if len(config.model_operations.op_library_filename):
        raise VerifyError(f"{where}: model_operations.op_library_filename "
                          f"{list(config.model_operations.op_library_filename)[:3]!r}; custom op libraries are "
                          "refused: allowed is none", model=model)
    if len(config.model_repository_agents.agents):
        raise VerifyError(f"{where}: model_repository_agents {[a.name for a in config.model_repository_agents.agents]!r}; "
                          "allowed is none", model=model)
    if "EXECUTION_ENV_PATH" in config.parameters:
        raise VerifyError(f"{where}: parameter EXECUTION_ENV_PATH "
                          f"{config.parameters['EXECUTION_ENV_PATH'].string_value[:120]!r}; an execution "
                          "environment of the tarball's is refused: allowed is the image's Python", model=model)
    accelerators = config.optimization.execution_accelerators
    for accelerator in (*accelerators.gpu_execution_accelerator, *accelerators.cpu_execution_accelerator):
        for key in sorted(set(accelerator.parameters) & set(TENSORRT_PATH_KEYS)):
            raise VerifyError(f"{where}: accelerator {accelerator.name!r} parameter {key!r} "
                              f"{accelerator.parameters[key][:120]!r}; path-valued keys ({TENSORRT_PATH_KEYS[key]}) "
                              "are refused: allowed are the keys that take no path", model=model)


def _check_python_folder(folder: Path, rule: PythonModelRule, model: str) -> None:
    """The python-backend folder: its config, and in its version folder exactly the rule's files,
    each code file with the rule's SHA-256."""
    wanted = {"config.pbtxt", *(f"{rule.version}/{name}" for name in (*rule.code, *rule.data))}
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    for name in sorted(present - wanted):
        raise VerifyError(f"model {model!r}: file {rule.folder + '/' + name!r}: not a file of the project's tokenizer "
                          f"model; allowed in {rule.folder}/: config.pbtxt, {rule.version}/model.py, the pinned "
                          f"tokenizers wheel's files and {', '.join(sorted(rule.data))}", model=model)
    for name in sorted(wanted - present):
        raise VerifyError(f"model {model!r}: file {rule.folder + '/' + name!r}: missing; the project's tokenizer model "
                          "needs it", model=model)
    for name, sha256 in sorted(rule.code.items()):
        digest = hashlib.sha256((folder / rule.version / name).read_bytes()).hexdigest()  # files of MB
        if digest != sha256:
            raise VerifyError(f"model {model!r}: file {f'{rule.folder}/{rule.version}/{name}'!r}: sha256 {digest[:16]}...; "
                              f"allowed is the project's file, sha256 {sha256[:16]}...", model=model)


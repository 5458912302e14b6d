"""Packaging (reproducible tarballs), the request codec of the smoke client, and ``open_model``.

Real tiny models are exported with torch (ONNX and TorchScript) and run with the real ONNX Runtime,
torch and tritonclient: nothing is mocked.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from triton_mme_cdk.model_build.artifact.backend import open_model
from triton_mme_cdk.model_build.artifact.pack import package_model
from triton_mme_cdk.model_build.artifact.render import render_config
from triton_mme_cdk.model_build.artifact.tarball import inspect_tarball, tarball_members
from triton_mme_cdk.model_build.artifact.triton_config import check_config
from triton_mme_cdk.model_build.errors import PackageError, VerifyError
from triton_mme_cdk.model_build.manifest import ModelSpec, Tolerance
from triton_mme_cdk.model_build.reference import read_reference, write_reference
from triton_mme_cdk.model_build.tools.smoke.codec import build_request
from triton_mme_cdk.model_build.types import ExportedModel, TensorSpec

TOLERANCE = Tolerance(atol=1e-4, rtol=1e-3)


class Tiny(torch.nn.Module):
    """Two layers, two inputs (float and int64) and two outputs ([batch, 3] and [batch])."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)

    def forward(self, x: Any, mask: Any) -> tuple[Any, Any]:
        hidden = torch.relu(self.l1(x * mask.to(x.dtype)))
        y = self.l2(hidden)
        return y, y.sum(dim=1)


@dataclass
class Built:
    spec: ModelSpec
    exported: ExportedModel
    config_text: str
    reference: Path


def _onnx_signature(path: Path) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    graph = onnx.load(str(path), load_external_data=False).graph

    def spec(value: Any) -> TensorSpec:
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorSpec(value.name, dtype, shape)

    return tuple(spec(v) for v in graph.input), tuple(spec(v) for v in graph.output)


@pytest.fixture(scope="module")
def tiny_torch() -> tuple[Any, dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    torch.manual_seed(0)
    module = Tiny().eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 0, 1, 1], [1, 1, 1, 1]], dtype=np.int64)
    with torch.inference_mode():
        y, score = module(torch.from_numpy(x), torch.from_numpy(mask))
    return module, {"x": x, "mask": mask}, (y.numpy(), score.numpy())


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory, tiny_torch: Any) -> Built:
    module, inputs, (y, score) = tiny_torch
    folder = tmp_path_factory.mktemp("onnx")
    path = folder / "exported.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["mask"])),
            str(path),
            input_names=["x", "mask"],
            output_names=["y", "score"],
            dynamic_axes={name: {0: "batch"} for name in ("x", "mask", "y", "score")},
            dynamo=False,
            opset_version=17,
        )
    spec = ModelSpec.model_validate(
        {
            "name": "tiny-onnx",
            "source": {"kind": "onnx", "path": "tiny.onnx"},
            "task": "feature-extraction",
            "max_batch_size": 4,
            "dynamic_batching": {"preferred_batch_size": [2, 4], "max_queue_delay_microseconds": 100},
            "onnxruntime": {
                "graph_optimization_level": "basic",
                "execution_mode": "parallel",
                "intra_op_thread_count": 1,
                # 2, not 1: ONNX Runtime quietly runs sequentially with one inter-op thread.
                "inter_op_thread_count": 2,
                "enable_mem_pattern": False,
                "cudnn_conv_algo_search": "heuristic",
            },
        }
    )
    ins, outs = _onnx_signature(path)
    exported = ExportedModel(name=spec.name, format="onnx", path=path, inputs=ins, outputs=outs)
    reference = folder / "reference.npz"
    write_reference(reference, inputs, {"y": y, "score": score})
    return Built(spec, exported, render_config(spec, exported), reference)


@pytest.fixture(scope="module")
def torchscript_model(tmp_path_factory: pytest.TempPathFactory, tiny_torch: Any) -> Built:
    module, inputs, (y, score) = tiny_torch
    folder = tmp_path_factory.mktemp("torchscript")
    path = folder / "traced.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.trace is deprecated but still what we ship
        traced = torch.jit.trace(module, (torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["mask"])))
    traced.save(str(path))
    spec = ModelSpec.model_validate(
        {
            "name": "tiny-ts",
            "source": {"kind": "local", "path": "tiny"},
            "task": "feature-extraction",
            "format": "torchscript",
            "max_batch_size": 4,
            "instance_group": {"kind": "KIND_CPU", "count": 1},
        }
    )
    exported = ExportedModel(
        name=spec.name,
        format="torchscript",
        path=path,
        inputs=(TensorSpec("x__0", "float32", (-1, 4)), TensorSpec("mask__1", "int64", (-1, 4))),
        outputs=(TensorSpec("y__0", "float32", (-1, 3)), TensorSpec("score__1", "float32", (-1,))),
    )
    reference = folder / "reference.npz"
    write_reference(
        reference,
        {"x__0": inputs["x"], "mask__1": inputs["mask"]},
        {"y__0": y, "score__1": score},
    )
    return Built(spec, exported, render_config(spec, exported), reference)


def _package(built: Built, out: Path, name: str | None = None, **kwargs: Any) -> tuple[str, int]:
    return package_model(
        model_name=name or built.spec.name,
        config_text=built.config_text,
        model_file=built.exported.path,
        format=built.spec.format,
        out_path=out,
        **kwargs,
    )


# --------------------------------------------------------------------------------------------
# Packaging
# --------------------------------------------------------------------------------------------


def test_package_is_byte_identical_whatever_the_mtimes(onnx_model: Built, tmp_path: Path) -> None:
    first = tmp_path / "a" / "model.tar.gz"
    second = tmp_path / "b" / "model.tar.gz"
    digest1, size1 = _package(onnx_model, first)
    os.utime(onnx_model.exported.path, (1_000_000_000, 1_000_000_000))
    os.chmod(onnx_model.exported.path, 0o600)
    digest2, size2 = _package(onnx_model, second)
    os.chmod(onnx_model.exported.path, 0o644)

    data = first.read_bytes()
    assert data == second.read_bytes()
    assert (digest1, size1) == (digest2, size2)
    assert digest1 == hashlib.sha256(data).hexdigest()
    assert size1 == len(data) == first.stat().st_size
    # gzip header: mtime 0 and no stored file name.
    assert data[:3] == b"\x1f\x8b\x08"
    assert data[3] & 0x08 == 0
    assert data[4:8] == b"\x00\x00\x00\x00"
    # A different compression level is a different, equally valid archive.
    digest3, _ = _package(onnx_model, tmp_path / "c.tar.gz", compresslevel=9)
    assert digest3 != digest1
    assert not list(tmp_path.glob("**/.model-*"))


def test_package_layout_and_metadata(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out, name="tiny-onnx-3")
    assert tarball_members(out) == [
        "tiny-onnx-3/",
        "tiny-onnx-3/1/",
        "tiny-onnx-3/1/model.onnx",
        "tiny-onnx-3/config.pbtxt",
    ]
    for member in inspect_tarball(out):
        assert (member.uid, member.gid, member.uname, member.gname, member.mtime) == (0, 0, "", "", 0)
        assert member.mode == (0o755 if member.type == "dir" else 0o644)
    with tarfile.open(out) as tar:
        assert tar.extractfile("tiny-onnx-3/config.pbtxt").read().decode() == onnx_model.config_text  # type: ignore[union-attr]
        model_bytes = tar.extractfile("tiny-onnx-3/1/model.onnx").read()  # type: ignore[union-attr]
    assert model_bytes == onnx_model.exported.path.read_bytes()


def test_package_torchscript_uses_model_pt(torchscript_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(torchscript_model, out)
    assert tarball_members(out) == ["tiny-ts/", "tiny-ts/1/", "tiny-ts/1/model.pt", "tiny-ts/config.pbtxt"]


def test_package_includes_onnx_external_data(onnx_model: Built, tmp_path: Path) -> None:
    folder = tmp_path / "external"
    folder.mkdir()
    model = onnx.load(str(onnx_model.exported.path))
    path = folder / "model.onnx"
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location="weights.bin", size_threshold=0,
    )
    (folder / "unrelated.txt").write_text("not part of the model")
    built = Built(onnx_model.spec, onnx_model.exported, onnx_model.config_text, onnx_model.reference)
    built.exported = ExportedModel(
        name=built.spec.name, format="onnx", path=path,
        inputs=onnx_model.exported.inputs, outputs=onnx_model.exported.outputs,
    )
    out = tmp_path / "model.tar.gz"
    _package(built, out)
    assert tarball_members(out) == [
        "tiny-onnx/", "tiny-onnx/1/", "tiny-onnx/1/model.onnx", "tiny-onnx/1/weights.bin",
        "tiny-onnx/config.pbtxt",
    ]
    # The tarball alone is enough to run the model: the weights came along.
    from triton_mme_cdk.model_build.artifact.tarball import safe_extract

    safe_extract(out, tmp_path / "unpacked")
    runner = open_model(tmp_path / "unpacked" / "tiny-onnx" / "1" / "model.onnx",
                        check_config(onnx_model.config_text), model="tiny-onnx")
    inputs, expected = read_reference(onnx_model.reference)
    got = runner.run(inputs, list(expected))
    for name, array in expected.items():
        np.testing.assert_allclose(got[name], array, atol=TOLERANCE.atol, rtol=TOLERANCE.rtol)

    (folder / "weights.bin").unlink()
    with pytest.raises(PackageError, match=r"'weights\.bin' is missing"):
        _package(built, tmp_path / "again.tar.gz")


def test_package_refuses_bad_inputs(onnx_model: Built, torchscript_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    with pytest.raises(PackageError, match=r"model_name: got '\.\./evil'"):
        _package(onnx_model, out, name="../evil")
    with pytest.raises(PackageError, match=r"(?s)config_text: .*optimization.graph.level: got 5"):
        package_model(
            model_name="tiny", config_text=onnx_model.config_text.replace("level: -1", "level: 5"),
            model_file=onnx_model.exported.path, format="onnx", out_path=out,
        )
    with pytest.raises(PackageError, match="backend 'pytorch' does not serve format 'onnx'"):
        package_model(
            model_name="tiny", config_text=torchscript_model.config_text,
            model_file=onnx_model.exported.path, format="onnx", out_path=out,
        )
    with pytest.raises(PackageError, match="format: got 'tensorflow'"):
        package_model(
            model_name="tiny", config_text=onnx_model.config_text,
            model_file=onnx_model.exported.path, format="tensorflow", out_path=out,
        )
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------


def test_verify_session_follows_the_config(onnx_model: Built, tmp_path: Path) -> None:
    import onnxruntime as ort

    config = check_config(onnx_model.config_text)
    runner = open_model(onnx_model.exported.path, config, model="tiny-onnx")
    options = runner.session.get_session_options()  # type: ignore[union-attr]
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 2)
    assert options.enable_mem_pattern is False


def test_open_model_refuses_config_that_does_not_match_graph(onnx_model: Built) -> None:
    text = onnx_model.config_text.replace('name: "mask"\n  data_type: TYPE_INT64', 'name: "mask"\n  data_type: TYPE_INT32')
    assert text != onnx_model.config_text
    with pytest.raises(VerifyError, match=r"config input 'mask': data_type TYPE_INT32; the onnx graph has INT64"):
        open_model(onnx_model.exported.path, check_config(text), model="tiny")


# --------------------------------------------------------------------------------------------
# The request/response codec
# --------------------------------------------------------------------------------------------


def test_request_body_is_triton_binary_json(onnx_model: Built, tiny_torch: Any) -> None:
    """The client side of the codec (the server side is the real tritonserver: tests/test_local_endpoint.py)."""
    _, inputs, _ = tiny_torch
    config = check_config(onnx_model.config_text)
    body, header_length = build_request(config, inputs)
    header = json.loads(body[:header_length])
    assert [(i["name"], i["datatype"], i["shape"]) for i in header["inputs"]] == [
        ("x", "FP32", [3, 4]),
        ("mask", "INT64", [3, 4]),
    ]
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 3 * 4 * 4}
    assert [(o["name"], o["parameters"]["binary_data"]) for o in header["outputs"]] == [
        ("y", True),
        ("score", True),
    ]
    assert len(body) == header_length + sum(array.nbytes for array in inputs.values())
    wrong_type = dict(inputs, mask=inputs["mask"].astype(np.int32))
    with pytest.raises(VerifyError, match=r"input 'mask': data has dtype 'int32' \(INT32\); the config expects INT64"):
        build_request(config, wrong_type)


def test_gzip_stream_of_package_is_a_valid_tar(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out)
    raw = gzip.decompress(out.read_bytes())
    assert len(raw) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert tar.getnames()[0] == "tiny-onnx"


# --------------------------------------------------------------------------------------------
# The pre-publish gate the build runs on every tarball it writes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new", "reason"), [
    ('name: "mask"\n  data_type: TYPE_INT64', 'name: "mask"\n  data_type: TYPE_INT32',
     "config input 'mask': data_type TYPE_INT32; the onnx graph has INT64 (allowed: TYPE_INT64)"),
    ('name: "mask"', 'name: "attention"', "config input 'attention': name not in the onnx graph; allowed: "
                                          "the graph's inputs 'mask', 'x'"),
    ("dims: 3", "dims: 5", "config output 'y': dims [5]; the onnx graph has [3]"),
], ids=["data type", "input name", "dims"])
def test_gate_refuses_a_packaged_config_not_the_graphs_and_leaves_no_tarball(
    onnx_model: Built, tmp_path: Path, old: str, new: str, reason: str
) -> None:
    """``check_config`` alone accepts these (they are valid configs); the build's gate does not."""
    from triton_mme_cdk.model_build.artifact.gate import gate_tarball

    text = onnx_model.config_text.replace(old, new, 1)
    assert text != onnx_model.config_text
    check_config(text, model="tiny-onnx")
    out = tmp_path / "model.tar.gz"
    package_model(model_name="tiny-onnx", config_text=text, model_file=onnx_model.exported.path,
                  format="onnx", out_path=out)
    with pytest.raises(VerifyError) as caught:
        gate_tarball(out, model="tiny-onnx")
    assert reason in str(caught.value) and caught.value.model == "tiny-onnx"
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing left to publish


def test_gate_reads_the_graph_without_an_onnx_runtime_session(onnx_model: Built, tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out)
    code = ("import sys; from pathlib import Path; from triton_mme_cdk.model_build.artifact.gate import check_repository; "
            f"print(check_repository(Path({str(out)!r}), model='tiny-onnx'), 'onnxruntime' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parents[1])
    assert result.stdout.split() == ["tiny-onnx", "False"], result.stderr
    assert not [p for p in tmp_path.iterdir() if p.name != "model.tar.gz"]  # its unpacked copy is gone

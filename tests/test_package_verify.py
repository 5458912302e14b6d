"""Packaging (reproducible tarballs) and verification (load and query like the container).

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
import tritonclient.http as httpclient

from model_build.errors import PackageError, VerifyError
from model_build.manifest import ModelSpec, Tolerance
from model_build.package import inspect_tarball, package_model, tarball_members
from model_build.triton_config import check_config, render_config
from model_build.types import ExportedModel, TensorSpec
from model_build.verify import (
    build_request,
    check_request,
    decode_request,
    encode_response,
    open_model,
    parse_request_header,
    parse_response,
    verify_artifact,
)

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


def _write_reference(path: Path, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> None:
    arrays = {f"input:{k}": v for k, v in inputs.items()} | {f"output:{k}": v for k, v in outputs.items()}
    np.savez(path, **arrays)


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
    _write_reference(reference, inputs, {"y": y, "score": score})
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
    _write_reference(
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
    result = verify_artifact(out, onnx_model.reference, tolerance=TOLERANCE)
    assert result.ok

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


def test_verify_onnx_round_trip(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out, name="tiny-onnx-0")
    result = verify_artifact(out, onnx_model.reference, tolerance=TOLERANCE, target_model="tiny-onnx-0.tar.gz")
    assert result.ok
    assert (result.target, result.format, result.version) == ("tiny-onnx-0.tar.gz", "onnx", 1)
    assert set(result.max_abs_diff) == {"y", "score"}
    assert result.worst < 1e-4
    assert result.providers == ("CPUExecutionProvider",)
    assert result.seconds > 0


def test_verify_torchscript_round_trip(torchscript_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(torchscript_model, out)
    result = verify_artifact(out, torchscript_model.reference, tolerance=TOLERANCE)
    assert result.ok
    assert (result.target, result.format) == ("tiny-ts", "torchscript")
    assert set(result.max_abs_diff) == {"y__0", "score__1"}
    assert result.worst < 1e-5


def test_verify_session_follows_the_config(onnx_model: Built, tmp_path: Path) -> None:
    import onnxruntime as ort

    config = check_config(onnx_model.config_text)
    runner = open_model(onnx_model.exported.path, config, model="tiny-onnx")
    options = runner.session.get_session_options()  # type: ignore[union-attr]
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 2)
    assert options.enable_mem_pattern is False


def test_verify_fails_beyond_tolerance(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out)
    with np.load(onnx_model.reference) as data:
        arrays = dict(data)
    arrays["output:score"] = arrays["output:score"] + np.array([0.0, 0.5, 0.0], dtype=np.float32)
    perturbed = tmp_path / "perturbed.npz"
    np.savez(perturbed, **arrays)
    with pytest.raises(VerifyError) as caught:
        verify_artifact(out, perturbed, tolerance=TOLERANCE, target_model="tiny-onnx-7")
    message = str(caught.value)
    assert "model 'tiny-onnx-7'" in message
    assert "output 'score'" in message
    assert "largest |difference| 0.5" in message
    assert "at index [1]" in message
    assert caught.value.model == "tiny-onnx-7"
    # Well inside a looser tolerance the same artifact passes.
    assert verify_artifact(out, perturbed, tolerance=Tolerance(atol=1.0, rtol=0.0)).ok


def test_verify_fails_on_nan_reference(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out)
    with np.load(onnx_model.reference) as data:
        arrays = dict(data)
    arrays["output:y"][0, 0] = np.nan
    bad = tmp_path / "nan.npz"
    np.savez(bad, **arrays)
    with pytest.raises(VerifyError, match=r"output 'y': 1 non-finite value\(s\)"):
        verify_artifact(out, bad, tolerance=Tolerance(atol=1e9, rtol=1e9))


def test_verify_accepts_config_at_tar_root(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "root.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(onnx_model.exported.path, arcname="1/model.onnx")
        data = onnx_model.config_text.encode()
        info = tarfile.TarInfo("config.pbtxt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    result = verify_artifact(out, onnx_model.reference, tolerance=TOLERANCE, target_model="root-model")
    assert result.ok and result.target == "root-model"


def _tar_with(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> None:
    with tarfile.open(path, "w:gz") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: tarfile.TarInfo("../evil"), "'../evil'"),
        (lambda: tarfile.TarInfo("m/../../evil"), "'m/../../evil'"),
        (lambda: tarfile.TarInfo("/etc/evil"), "'/etc/evil'"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute"],
)
def test_verify_refuses_escaping_paths(onnx_model: Built, tmp_path: Path, make: Any, expected: str) -> None:
    member = make()
    member.size = 4
    tarball = tmp_path / "box" / "evil.tar.gz"
    tarball.parent.mkdir()
    _tar_with(tarball, member, b"evil")
    with pytest.raises(VerifyError) as caught:
        verify_artifact(tarball, onnx_model.reference, tolerance=TOLERANCE)
    assert expected in str(caught.value)
    assert "contains '..'" in str(caught.value)
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE], ids=["symlink", "hardlink"])
def test_verify_refuses_links(onnx_model: Built, tmp_path: Path, kind: bytes) -> None:
    tarball = tmp_path / "link.tar.gz"
    member = tarfile.TarInfo("tiny/1/model.onnx")
    member.type = kind
    member.linkname = "/etc/passwd"
    _tar_with(tarball, member)
    with pytest.raises(VerifyError, match=r"'tiny/1/model.onnx': is a (symlink|hard link) to '/etc/passwd'"):
        verify_artifact(tarball, onnx_model.reference, tolerance=TOLERANCE)


def test_verify_refuses_two_top_level_directories(onnx_model: Built, tmp_path: Path) -> None:
    tarball = tmp_path / "two.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        for name in ("a", "b"):
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
    with pytest.raises(VerifyError, match=r"top level holds \['a/', 'b/'\]"):
        verify_artifact(tarball, onnx_model.reference, tolerance=TOLERANCE)


def test_verify_refuses_config_that_does_not_match_graph(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    text = onnx_model.config_text.replace('name: "mask"\n  data_type: TYPE_INT64', 'name: "mask"\n  data_type: TYPE_INT32')
    assert text != onnx_model.config_text
    package_model(
        model_name="tiny", config_text=text, model_file=onnx_model.exported.path, format="onnx", out_path=out
    )
    with pytest.raises(VerifyError, match=r"config input 'mask': data_type TYPE_INT32; the onnx graph has INT64"):
        verify_artifact(out, onnx_model.reference, tolerance=TOLERANCE)


# --------------------------------------------------------------------------------------------
# The request/response codec
# --------------------------------------------------------------------------------------------


def test_request_body_decodes_back_to_the_inputs(onnx_model: Built, tiny_torch: Any) -> None:
    _, inputs, _ = tiny_torch
    config = check_config(onnx_model.config_text)
    body, header_length = build_request(config, inputs)
    header = parse_request_header(body, header_length)
    assert [(i["name"], i["datatype"], i["shape"]) for i in header["inputs"]] == [
        ("x", "FP32", [3, 4]),
        ("mask", "INT64", [3, 4]),
    ]
    assert header["inputs"][0]["parameters"] == {"binary_data_size": 3 * 4 * 4}
    assert [(o["name"], o["parameters"]["binary_data"]) for o in header["outputs"]] == [
        ("y", True),
        ("score", True),
    ]
    decoded = decode_request(body, header_length)
    assert set(decoded) == {"x", "mask"}
    for name, array in inputs.items():
        assert decoded[name].dtype == array.dtype
        assert np.array_equal(decoded[name], array)
    check_request(config, decoded, requested_outputs=["y", "score"], model="tiny-onnx")

    with pytest.raises(VerifyError, match="bytes after the last input"):
        decode_request(body + b"\x00", header_length)
    with pytest.raises(VerifyError, match="runs past the end"):
        decode_request(body[:-1], header_length)


def test_request_check_follows_triton_rules(onnx_model: Built, tiny_torch: Any) -> None:
    _, inputs, _ = tiny_torch
    config = check_config(onnx_model.config_text)
    too_big = {k: np.concatenate([v, v]) for k, v in inputs.items()}  # batch 6 > max_batch_size 4
    with pytest.raises(VerifyError, match=r"request input 'x': shape \[6, 4\]; the batch dimension must be 1 to max_batch_size \(4\)"):
        check_request(config, too_big, model="tiny-onnx")
    wrong_type = dict(inputs, mask=inputs["mask"].astype(np.int32))
    with pytest.raises(VerifyError, match=r"input 'mask': data has dtype 'int32' \(INT32\); the config expects INT64"):
        build_request(config, wrong_type)
    with pytest.raises(VerifyError, match="request input 'extra': not in the config"):
        check_request(config, dict(inputs, extra=inputs["x"]), model="tiny-onnx")


def test_bytes_tensors_survive_the_codec() -> None:
    text = (
        'name: "text"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'
        'input { name: "sentence" data_type: TYPE_STRING dims: [ 1 ] }\n'
        'output { name: "y" data_type: TYPE_FP32 dims: [ 1 ] }\n'
    )
    config = check_config(text)
    sentences = np.array([[b"hello"], ["wörld".encode()]], dtype=np.object_)
    body, header_length = build_request(config, {"sentence": sentences})
    decoded = decode_request(body, header_length)
    assert decoded["sentence"].shape == (2, 1)
    assert list(decoded["sentence"].ravel()) == [b"hello", "wörld".encode()]


def test_response_is_read_by_tritonclient() -> None:
    outputs = {
        "y": np.arange(6, dtype=np.float32).reshape(2, 3),
        "ids": np.array([[1], [2]], dtype=np.int64),
        "label": np.array([b"cat", b"dog"], dtype=np.object_),
    }
    body, header_length = encode_response(outputs, model_name="m-0.tar.gz", model_version="1")
    header = json.loads(body[:header_length])
    assert header["model_name"] == "m-0.tar.gz"
    assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [24, 16, 14]
    result = parse_response(body, header_length)
    assert isinstance(result, httpclient.InferResult)
    for name, array in outputs.items():
        got = result.as_numpy(name)
        assert got is not None and got.shape == array.shape
        assert np.array_equal(got, array)
    assert result.as_numpy("missing") is None


def test_gzip_stream_of_package_is_a_valid_tar(onnx_model: Built, tmp_path: Path) -> None:
    out = tmp_path / "model.tar.gz"
    _package(onnx_model, out)
    raw = gzip.decompress(out.read_bytes())
    assert len(raw) % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert tar.getnames()[0] == "tiny-onnx"

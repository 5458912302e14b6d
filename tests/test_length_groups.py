"""Length grouping inside the served ONNX graph (``text.group_by_length``,
model_build/export/length_groups.py).

(a) The rewritten graph plans its groups exactly as :func:`plan_groups` says (two groups only
    when they save >= 15% of the positions and every row is right-padded and non-empty; else one
    group, cut to the longest row only when right-padded), and its outputs equal the plain graph's,
    for each architecture of each tokenizer kind (BERT, RoBERTa, XLM-R), exported by the build.
(b) The weights are held once: same initializers, one Loop holding one copy of the encoder; weights in
    an external data file (a model over 2 GiB) stay in that file, unchanged.
(c) Where it applies by default, and one clear error where ``true`` is given but cannot apply.
(d) A graph whose rows depend on padding stays plain by default (the record says why) and is one
    typed error when grouping was asked for; a graph without ``attention_mask`` likewise.

Serving the grouped graph on the real tritonserver (ONNX Runtime 1.19) is covered by the
raw-text tests of each kind (tests/test_tokenizer_kinds.py, tests/test_cross_encoder.py), whose
KIND_CPU targets are grouped by default.
"""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

from triton_mme_cdk.model_build.errors import ExportError, ManifestError, ValidationMismatchError
from triton_mme_cdk.model_build.export.convert import onnx_signature
from triton_mme_cdk.model_build.export.fusion import iter_nodes
from triton_mme_cdk.model_build.export.length_groups import (
    MIN_SAVING_PERCENT,
    group_by_length,
    group_lengths,
    plan_groups,
)
from triton_mme_cdk.model_build.export.validate import exported_runner
from triton_mme_cdk.model_build.manifest import parse_manifest
from triton_mme_cdk.model_build.tools.text_sources import KINDS, make_text_source
from triton_mme_cdk.model_build.types import ExportedModel

MAX_LEN = 48


def spec_for(**overrides: Any):  # -> ModelSpec
    entry = {"name": "tiny", "source": {"kind": "local", "path": "source"}, "task": "sentence-embedding",
             "max_batch_size": 8, "instance_group": {"kind": "KIND_CPU", "count": 1},
             "text": {"max_sequence_length": MAX_LEN}, **overrides}
    return parse_manifest({"models": [entry]}).models[0]


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module", params=KINDS)
def plain(request, tmp_path_factory):
    """The build's plain export (grouping off) of a small random model of each kind's architecture."""
    from triton_mme_cdk.model_build.export.validate import export_and_validate

    base = tmp_path_factory.mktemp(request.param)
    make_text_source(request.param, base / "source", pooling="mean", max_length=MAX_LEN)
    spec = spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": False})
    exported, report, _ = export_and_validate(spec, base_dir=base, work_dir=base / "work")
    assert report.length_grouping is None  # false: not asked for, nothing recorded
    return exported


def _masks(rng: np.random.Generator, trials: int) -> list[np.ndarray]:
    """Right-padded batches of random lengths, some left-padded, some with an empty row."""
    masks = []
    for trial in range(trials):
        batch, width = int(rng.integers(1, 9)), int(rng.integers(1, MAX_LEN + 1))
        lengths = rng.integers(0 if trial % 7 == 0 else 1, width + 1, batch)
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        masks.append(mask[:, ::-1].copy() if trial % 5 == 0 else mask)
    return masks


def test_grouped_graph_plans_like_plan_groups_and_equals_the_plain_graph(plain):
    model = onnx.load(str(plain.path))
    plain_session = _session(plain.path)
    grouped = _session(group_by_length(model, expose_plan=True))
    names = [tensor.name for tensor in plain.inputs]
    rng = np.random.default_rng(0)
    shapes: collections.Counter[int] = collections.Counter()
    worst = 0.0
    for mask in _masks(rng, 80):
        feeds = {"input_ids": rng.integers(5, 300, mask.shape).astype(np.int64), "attention_mask": mask,
                 "token_type_ids": np.zeros_like(mask)}
        feeds = {name: feeds[name] for name in names}
        expected = plain_session.run(None, feeds)[0]
        actual, trips, starts, ends, widths = grouped.run(None, feeds)
        got = tuple((int(starts[i]), int(ends[i]), int(widths[i])) for i in range(int(trips)))
        assert got == plan_groups(mask).groups, (mask.tolist(), got)
        shapes[len(got)] += 1
        np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-4)
        worst = max(worst, float(np.abs(actual - expected).max()))
    print(f"{plain.path.parent.parent.parent.name}: max |diff| grouped vs plain {worst:.1e} over 80 batches {dict(shapes)}")
    assert shapes[2] >= 10 and shapes[1] >= 10  # both paths taken


def test_plan_splits_only_where_it_saves_enough():
    def mask(lengths: list[int], width: int | None = None) -> np.ndarray:
        width = width or max(lengths)
        return (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)

    # 8 rows, 4 short: 4*10 + 4*50 = 240 of 400 positions.
    assert plan_groups(mask([10, 50] * 4)).groups == ((0, 4, 10), (4, 8, 50))
    # Lengths close together: the best split saves under 15%, so one group.
    assert plan_groups(mask([45, 50] * 4)).groups == ((0, 8, 50),)
    # One row: nothing to split, but padding past the longest row is cut.
    assert plan_groups(mask([7], width=30)).groups == ((0, 1, 7),)
    # Left padding: the batch runs as given.
    assert plan_groups(mask([10, 50] * 4)[:, ::-1]).groups == ((0, 8, 50),)
    assert MIN_SAVING_PERCENT == 15


def test_grouped_graph_holds_the_weights_once(plain):
    model = onnx.load(str(plain.path))
    grouped = group_by_length(model)
    assert [t.name for t in grouped.graph.initializer] == [t.name for t in model.graph.initializer]
    assert [t.name for t in grouped.graph.input] == [t.name for t in model.graph.input]
    assert [t.name for t in grouped.graph.output] == [t.name for t in model.graph.output]
    loops = [node for node in grouped.graph.node if node.op_type == "Loop"]
    assert len(loops) == 1
    body_ops = collections.Counter(node.op_type for node in iter_nodes(loops[0].attribute[0].g))
    for op, count in collections.Counter(node.op_type for node in model.graph.node).items():
        assert body_ops[op] >= count  # every encoder node once (plus the body's own gathers)
    assert not [t for t in grouped.graph.node if t.op_type == "If"]
    assert len(grouped.SerializeToString()) - len(model.SerializeToString()) < 64 * 1024
    onnx.checker.check_model(grouped)


def test_weights_in_an_external_data_file_stay_there_unread(plain, tmp_path):
    """A model over the 2 GiB protobuf limit keeps its weights in ``model.onnx.data`` (the export's
    ``save_onnx``). The rewrite touches the graph alone: the weight file is the same bytes after, the
    grouped graph points into it, and answers as the plain one did (before: the first save of the
    candidate moved the weights out of the in-memory proto, and the second deleted the file)."""
    path = tmp_path / "model.onnx"
    onnx.save_model(onnx.load(str(plain.path)), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
    weights = (tmp_path / "model.onnx.data").read_bytes()
    exported = ExportedModel(name="tiny", format="onnx", path=path, inputs=plain.inputs, outputs=plain.outputs)
    mask = (np.arange(30)[None, :] < np.array([3, 30, 4, 30])[:, None]).astype(np.int64)
    feeds = {"input_ids": np.where(mask == 1, 9, 0).astype(np.int64), "attention_mask": mask,
             "token_type_ids": np.zeros_like(mask)}
    feeds = {t.name: feeds[t.name] for t in plain.inputs}
    expected = _session(plain.path).run(None, feeds)[0]
    kept, line = group_lengths(spec_for(), exported, [feeds], runner_for=exported_runner)
    assert kept is exported
    assert line is not None and line.startswith("on: "), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]  # no scratch left
    assert (tmp_path / "model.onnx.data").read_bytes() == weights
    grouped = onnx.load(str(path), load_external_data=False)
    assert [n.op_type for n in grouped.graph.node].count("Loop") == 1
    assert path.stat().st_size < len(weights)  # the graph alone: no weight was written into it
    np.testing.assert_allclose(_session(path).run(None, feeds)[0], expected, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------------------------
# (c) Where it applies
# --------------------------------------------------------------------------------------------


def test_default_is_on_for_kind_cpu_pooled_text_models_only():
    assert spec_for().groups_by_length
    assert spec_for(task="text-classification").groups_by_length
    assert spec_for(inputs="text").groups_by_length
    assert not spec_for(instance_group={"kind": "KIND_GPU", "count": 1}).groups_by_length
    assert not spec_for(instance_group={"kind": "KIND_AUTO", "count": 1}).groups_by_length
    assert not spec_for(task="feature-extraction").groups_by_length
    assert not spec_for(max_batch_size=1).groups_by_length
    assert not spec_for(format="torchscript").groups_by_length
    assert not spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": False}).groups_by_length


@pytest.mark.parametrize(("overrides", "expected"), [
    ({"instance_group": {"kind": "KIND_GPU", "count": 1}}, "instance_group.kind is KIND_GPU"),
    ({"task": "feature-extraction"}, "returns one vector per token"),
    ({"max_batch_size": 1}, "max_batch_size is 1"),
    ({"format": "torchscript"}, "format is 'torchscript'"),
])
def test_true_where_it_cannot_apply_is_one_error_naming_the_field(overrides, expected):
    with pytest.raises(ManifestError) as caught:
        spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": True}, **overrides)
    message = str(caught.value)
    assert "text.group_by_length: got true, but" in message and expected in message, message


# --------------------------------------------------------------------------------------------
# (d) Graphs it does not fit
# --------------------------------------------------------------------------------------------


def _graph_file(path: Path, *, masked: bool = True) -> ExportedModel:
    """A pooled graph whose rows DO depend on padding: the mean of the ids over every column."""
    ids = oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = oh.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])
    out = oh.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])
    nodes = [oh.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
             oh.make_node("ReduceMean", ["ids_f"], ["score"], axes=[1], keepdims=1)]
    if masked:  # the mask is an input (as the tokenizer sends it) but the graph ignores it
        nodes.append(oh.make_node("Identity", ["attention_mask"], ["unused"]))
    graph = oh.make_graph(nodes, "mean", [ids, mask] if masked else [ids], [out])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8), str(path))
    inputs, outputs = onnx_signature(path, model_name="tiny")
    return ExportedModel(name="tiny", format="onnx", path=path, inputs=inputs, outputs=outputs)


def _samples(masked: bool = True) -> list[dict[str, np.ndarray]]:
    lengths = np.array([2, 20, 20, 20])  # splitting after the first row saves 22% of the positions
    mask = (np.arange(20)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, 7, 1).astype(np.int64)
    return [{"input_ids": ids, "attention_mask": mask} if masked else {"input_ids": ids}]


def test_a_graph_whose_rows_depend_on_padding_stays_plain_by_default(tmp_path):
    exported = _graph_file(tmp_path / "model.onnx")
    before = exported.path.read_bytes()
    kept, line = group_lengths(spec_for(), exported, _samples(), runner_for=exported_runner)
    assert kept == exported and exported.path.read_bytes() == before
    assert line is not None and line.startswith("off: the grouped graph differed from the plain one"), line
    assert "'score'" in line


def test_a_graph_whose_rows_depend_on_padding_is_an_error_when_grouping_was_asked_for(tmp_path):
    exported = _graph_file(tmp_path / "model.onnx")
    before = exported.path.read_bytes()
    spec = spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": True})
    with pytest.raises(ValidationMismatchError) as caught:
        group_lengths(spec, exported, _samples(), runner_for=exported_runner)
    assert "text.group_by_length" in str(caught.value) and caught.value.output == "score"
    assert exported.path.read_bytes() == before  # nothing half-written


def test_a_graph_without_attention_mask(tmp_path):
    exported = _graph_file(tmp_path / "model.onnx", masked=False)
    kept, line = group_lengths(spec_for(), exported, _samples(masked=False), runner_for=exported_runner)
    assert kept == exported and line == "off: the graph has no 'attention_mask' input (inputs: input_ids)"
    spec = spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": True})
    with pytest.raises(ExportError, match=r"text.group_by_length: got true, but the graph has no 'attention_mask'"):
        group_lengths(spec, exported, _samples(masked=False), runner_for=exported_runner)


def test_a_grouped_build_is_recorded_and_served_equal_to_the_plain_one(tmp_path):
    """The build's own path: on by default for KIND_CPU, its line in the report, and the grouped
    file's outputs equal the plain build's on a batch that splits."""
    from triton_mme_cdk.model_build.export.validate import export_and_validate

    make_text_source("wordpiece", tmp_path / "source", pooling="mean", max_length=MAX_LEN)
    grouped, report, _ = export_and_validate(spec_for(), base_dir=tmp_path, work_dir=tmp_path / "grouped")
    assert report.length_grouping is not None and report.length_grouping.startswith("on: up to 2 length groups")
    shutil.rmtree(tmp_path / "_sources", ignore_errors=True)
    plain, _, _ = export_and_validate(spec_for(text={"max_sequence_length": MAX_LEN, "group_by_length": False}),
                                      base_dir=tmp_path, work_dir=tmp_path / "plain")
    mask = (np.arange(30)[None, :] < np.array([3, 30, 4, 30])[:, None]).astype(np.int64)
    feeds = {"input_ids": np.where(mask == 1, 9, 0).astype(np.int64), "attention_mask": mask,
             "token_type_ids": np.zeros_like(mask)}
    feeds = {t.name: feeds[t.name] for t in plain.inputs}
    assert plan_groups(mask).groups == ((0, 2, 4), (2, 4, 30))
    np.testing.assert_allclose(_session(grouped.path).run(None, feeds)[0], _session(plain.path).run(None, feeds)[0],
                               atol=1e-5, rtol=1e-4)

"""Length grouping inside the served ONNX graph: a padded batch runs as two narrower ones.

Why: a text request is padded to its longest row, and an encoder's cost grows with every padded
position. At batch 8 on the benchmark's sentences 29% (BPE) to 43% (WordPiece) of the positions
computed hold no token. Servers built for text (text-embeddings-inference) sort rows by length and
run groups of similar length. On a SageMaker multi-model endpoint that cannot happen outside the
model: the Triton server there loads only the ensemble and its steps (no BLS model), a step cannot
take an empty batch, and Triton's HTTP path refuses decoupled responses (docs/manifest.md,
"Length grouping"). So the grouping is written into the model graph itself.

The rewritten graph, for inputs ``[batch, sequence]`` and outputs with one row per input row:

1. each row's length is the sum of its ``attention_mask``; the rows are sorted by length (``TopK``);
2. the split into two groups with the fewest positions is found (group one: the ``k`` shortest
   rows at the width of the longest of them; group two: the rest at the batch's longest length);
3. the encoder runs once per group inside a ``Loop`` (one copy of its nodes: the weights and
   ONNX Runtime's pre-packed copies of them are held once), each group cut to its own width;
4. the groups' outputs are concatenated and put back in the request's row order.

It splits only when that saves at least :data:`MIN_SAVING_PERCENT` of the positions (a smaller
saving does not pay for a second run), and only when every row is right-padded (``mask[r, j] == 1``
exactly for ``j < length[r]``) with at least one token; otherwise the encoder runs once on the whole
batch, cut to its longest row when the rows are right-padded, as given when not. A row's output
does not depend on padding columns beyond its length (they are masked out of attention and
pooling), which :func:`group_lengths` proves on the build's samples for every model before it
serves the grouped graph.

Where it applies (``ModelSpec.length_grouping_refusal`` and :func:`graph_allows_grouping`): ONNX, ``instance_group.kind`` KIND_CPU, text inputs,
``max_batch_size`` 2 or more, and pooled outputs only (a token-level output would have to be
padded back). On a GPU one launch of the whole batch is the cheaper path, so it is off there.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as oh

from triton_mme_cdk.model_build.errors import ExportError, ValidationMismatchError
from triton_mme_cdk.model_build.export.eager import Batch
from triton_mme_cdk.model_build.export.optimize import Runner, row_cosines
from triton_mme_cdk.model_build.manifest import PAIR_TASKS, ModelSpec
from triton_mme_cdk.model_build.types import ExportedModel

#: Split only when the two groups compute at least this share of the batch's positions fewer.
#: Measured (the benchmark's Unigram model, ONNX Runtime 1.19, 2 cores): runs of 4x27 and 4x50
#: tokens, 77% of the positions of one 8x50 run, took 85% of its time (32.7 against 38.6 ms), so a
#: second run costs about 8% of a batch-8 run; 15% leaves a margin.
MIN_SAVING_PERCENT = 15
#: The input whose rows give the lengths.
MASK_INPUT = "attention_mask"
#: The lowest default-domain opset the rewritten graph's nodes need (ReduceSum's axes input,
#: Unsqueeze's axes input, Loop over sequences).
MIN_OPSET = 13
#: Parity between the grouped and the plain graph, FP32: the same rows through the same weights,
#: only the matrix widths differ (measured differences 0 to 1.2e-7).
PARITY_ATOL = 1e-5
PARITY_RTOL = 1e-4
#: Intermediate values :func:`group_by_length` can expose as extra outputs (tests read the plan).
PLAN_OUTPUTS = ("lg_trips", "lg_starts", "lg_ends", "lg_widths")

_P = "lg_"  # values of the outer graph added here
_B = "lgb_"  # values inside the loop body


@dataclass(frozen=True)
class GroupPlan:
    """What the graph does with one batch (:func:`plan_groups`, the graph's logic in Python)."""

    #: Row index ranges into the rows sorted by length, and each group's width.
    groups: tuple[tuple[int, int, int], ...]


def plan_groups(mask: np.ndarray, *, min_saving_percent: int = MIN_SAVING_PERCENT) -> GroupPlan:
    """The groups the rewritten graph runs for ``mask`` (``[batch, sequence]``), for tests and docs."""
    present = mask != 0
    lengths = present.sum(axis=1).astype(np.int64)
    batch, width = mask.shape
    right_padded = bool((present == (np.arange(width)[None, :] < lengths[:, None])).all())
    trim = right_padded and int(lengths.min()) > 0
    ordered = np.sort(lengths, kind="stable")
    longest = int(ordered[-1])
    costs = [k * int(ordered[k - 1]) + (batch - k) * longest for k in range(1, batch + 1)]
    best_k = int(np.argmin(costs)) + 1
    saves = costs[best_k - 1] * 100 <= batch * longest * (100 - min_saving_percent)
    if trim and saves and best_k < batch:
        return GroupPlan(groups=((0, best_k, int(ordered[best_k - 1])), (best_k, batch, longest)))
    return GroupPlan(groups=((0, batch, longest if trim else width),))


# --------------------------------------------------------------------------------------------
# Where it applies
# --------------------------------------------------------------------------------------------


def graph_allows_grouping(model: onnx.ModelProto, exported: ExportedModel) -> str | None:
    """Why the exported graph cannot be grouped, or ``None``."""
    names = [tensor.name for tensor in exported.inputs]
    if MASK_INPUT not in names:
        return f"the graph has no {MASK_INPUT!r} input (inputs: {', '.join(names)})"
    for tensor in exported.inputs:
        if len(tensor.shape) != 2 or tensor.shape[0] != -1:
            return f"input {tensor.name!r} has shape {list(tensor.shape)}; expected [batch, sequence]"
    for tensor in exported.outputs:
        if not tensor.shape or tensor.shape[0] != -1 or -1 in tensor.shape[1:]:
            return (f"output {tensor.name!r} has shape {list(tensor.shape)}; length grouping needs "
                    "one fixed-size row per input row (a pooled output)")
    opset = next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET:
        return f"the graph's opset is {opset}; length grouping needs {MIN_OPSET} or newer"
    if any(a.HasField("g") or len(a.graphs) for node in model.graph.node for a in node.attribute):
        return "the graph already has control flow (If, Loop or Scan)"
    taken = [name for node in model.graph.node for name in node.output if name.startswith((_P, _B))]
    if taken:
        return f"the graph already has values named {_P}* or {_B}* ({taken[0]!r})"
    return None


# --------------------------------------------------------------------------------------------
# The rewrite
# --------------------------------------------------------------------------------------------


def _const(name: str, values: int | list[int]) -> onnx.NodeProto:
    dims = [len(values)] if isinstance(values, list) else []
    data = values if isinstance(values, list) else [values]
    return oh.make_node("Constant", [], [_P + name], value=oh.make_tensor(_P + name, TensorProto.INT64, dims, data))


def _node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attributes: Any) -> onnx.NodeProto:
    """A node of the outer graph; its value names get the outer prefix."""
    return oh.make_node(op, [_P + name for name in inputs], [_P + name for name in outputs], **attributes)


def _plan_nodes(mask: str, min_saving_percent: int) -> list[onnx.NodeProto]:
    """Lengths, the sorted order and the groups (``lg_trips`` of them: ``lg_starts``..``lg_ends``
    into ``lg_order``, at ``lg_widths``), as :func:`plan_groups` computes them."""
    return [
        _const("zero", 0), _const("one", 1), _const("two", 2), _const("ax0", [0]), _const("ax1", [1]),
        _const("hundred", 100), _const("keep", 100 - min_saving_percent),
        oh.make_node("Cast", [mask], [_P + "present"], to=TensorProto.BOOL),
        _node("Cast", ["present"], ["present64"], to=TensorProto.INT64),
        _node("ReduceSum", ["present64", "ax1"], ["len"], keepdims=0),
        oh.make_node("Shape", [mask], [_P + "shape"]),
        _node("Gather", ["shape", "zero"], ["B"]), _node("Gather", ["shape", "one"], ["W"]),
        _node("Unsqueeze", ["B", "ax0"], ["B1"]),
        _node("TopK", ["len", "B1"], ["sorted", "order"], largest=0, sorted=1),
        _node("Sub", ["B", "one"], ["Bm1"]),
        _node("Gather", ["sorted", "Bm1"], ["longest"]), _node("Gather", ["sorted", "zero"], ["shortest"]),
        # Right padding: present[r, j] == (j < len[r]) everywhere, and no empty row.
        _node("Range", ["zero", "W", "one"], ["columns"]),
        _node("Unsqueeze", ["len", "ax1"], ["len_col"]),
        _node("Less", ["columns", "len_col"], ["expected"]),
        _node("Xor", ["expected", "present"], ["stray"]),
        _node("Cast", ["stray"], ["stray64"], to=TensorProto.INT64),
        _node("ReduceMax", ["stray64"], ["strays"], keepdims=0),
        _node("Equal", ["strays", "zero"], ["right_padded"]),
        _node("Greater", ["shortest", "zero"], ["no_empty_row"]),
        _node("And", ["right_padded", "no_empty_row"], ["trim"]),
        # Cost of splitting after the k shortest rows, k = 1..B (k = B: one group).
        _node("Add", ["B", "one"], ["Bp1"]),
        _node("Range", ["one", "Bp1", "one"], ["ks"]),
        _node("Sub", ["ks", "one"], ["ks_m1"]),
        _node("Gather", ["sorted", "ks_m1"], ["width_k"]),
        _node("Mul", ["ks", "width_k"], ["cost_a"]), _node("Sub", ["B", "ks"], ["rest"]),
        _node("Mul", ["rest", "longest"], ["cost_b"]), _node("Add", ["cost_a", "cost_b"], ["cost"]),
        _node("Cast", ["cost"], ["cost_f"], to=TensorProto.FLOAT),  # ArgMin has no int64 CPU kernel
        _node("ArgMin", ["cost_f"], ["k_index"], keepdims=0, select_last_index=0),
        _node("Gather", ["cost", "k_index"], ["best"]),
        _node("Mul", ["B", "longest"], ["full"]),
        _node("Mul", ["best", "hundred"], ["best100"]), _node("Mul", ["full", "keep"], ["full_keep"]),
        _node("LessOrEqual", ["best100", "full_keep"], ["saves"]),
        _node("Add", ["k_index", "one"], ["k_best"]),
        _node("Less", ["k_best", "B"], ["two_groups"]),
        _node("And", ["saves", "two_groups"], ["saves2"]),
        _node("And", ["saves2", "trim"], ["split"]),
        _node("Where", ["split", "k_best", "B"], ["k"]),
        _node("Where", ["split", "two", "one"], ["trips"]),
        _node("Sub", ["k", "one"], ["k_m1"]), _node("Gather", ["sorted", "k_m1"], ["width_a"]),
        _node("Where", ["trim", "longest", "W"], ["width_b"]),
        # One group: rows 0..B at width_b; two: 0..k at width_a, k..B at width_b.
        _node("Where", ["split", "width_a", "width_b"], ["width_0"]),
        _node("Unsqueeze", ["zero", "ax0"], ["zero1"]), _node("Unsqueeze", ["k", "ax0"], ["k1"]),
        _node("Unsqueeze", ["width_0", "ax0"], ["width_01"]), _node("Unsqueeze", ["width_b", "ax0"], ["width_b1"]),
        _node("Concat", ["zero1", "k1"], ["starts"], axis=0),
        _node("Concat", ["k1", "B1"], ["ends"], axis=0),
        _node("Concat", ["width_01", "width_b1"], ["widths"], axis=0),
        oh.make_node("Constant", [], [_P + "true"], value=oh.make_tensor(_P + "true", TensorProto.BOOL, [], [True])),
    ]


def _body(graph: onnx.GraphProto, outer: set[str]) -> onnx.GraphProto:
    """The loop body: group ``i``'s rows, cut to its width, through a copy of the encoder's nodes."""
    nodes = [
        oh.make_node("Identity", [_B + "cond"], [_B + "cond_out"]),
        oh.make_node("Unsqueeze", [_B + "i", _P + "ax0"], [_B + "i1"]),
        oh.make_node("Gather", [_P + "starts", _B + "i1"], [_B + "start"]),
        oh.make_node("Gather", [_P + "ends", _B + "i1"], [_B + "end"]),
        oh.make_node("Gather", [_P + "widths", _B + "i1"], [_B + "width"]),
        oh.make_node("Slice", [_P + "order", _B + "start", _B + "end", _P + "ax0"], [_B + "rows"]),
    ]
    renamed: dict[str, str] = {}
    for tensor in graph.input:
        rows, cut = _B + tensor.name + "_rows", _B + tensor.name
        nodes += [oh.make_node("Gather", [tensor.name, _B + "rows"], [rows], axis=0),
                  oh.make_node("Slice", [rows, _P + "zero1", _B + "width", _P + "ax1"], [cut])]
        renamed[tensor.name] = cut
    for index, original in enumerate(graph.node):
        node = onnx.NodeProto()
        node.CopyFrom(original)
        node.name = f"{_B}{index}_{original.name}"
        node.input[:] = [renamed.get(name, name if (not name or name in outer) else _B + name)
                         for name in original.input]
        node.output[:] = [_B + name if name else name for name in original.output]
        nodes.append(node)
    inputs = [oh.make_tensor_value_info(_B + "i", TensorProto.INT64, []),
              oh.make_tensor_value_info(_B + "cond", TensorProto.BOOL, [])]
    outputs = [oh.make_tensor_value_info(_B + "cond_out", TensorProto.BOOL, [])]
    for tensor in graph.output:
        dtype = tensor.type.tensor_type.elem_type
        inputs.append(oh.make_tensor_sequence_value_info(_B + "seq_" + tensor.name, dtype, None))
        nodes.append(oh.make_node("SequenceInsert", [_B + "seq_" + tensor.name, _B + tensor.name],
                                  [_B + "seq_out_" + tensor.name]))
        outputs.append(oh.make_tensor_sequence_value_info(_B + "seq_out_" + tensor.name, dtype, None))
    return oh.make_graph(nodes, "length_group", inputs, outputs)


def group_by_length(
    model: onnx.ModelProto,
    *,
    mask: str = MASK_INPUT,
    min_saving_percent: int = MIN_SAVING_PERCENT,
    expose_plan: bool = False,
) -> onnx.ModelProto:
    """``model`` rewritten to run its encoder once per length group (module docstring), as a new
    proto (``model`` is left as it was; :func:`group_lengths` rewrites its own copy in place).

    The inputs, outputs, initializers, opsets and metadata stay as they were: the Triton config
    and the clients see the same signature. ``expose_plan`` adds :data:`PLAN_OUTPUTS` as outputs.
    """
    grouped = onnx.ModelProto()
    grouped.CopyFrom(model)
    _group_in_place(grouped.graph, mask=mask, min_saving_percent=min_saving_percent, expose_plan=expose_plan)
    return grouped


def _group_in_place(graph: onnx.GraphProto, *, mask: str, min_saving_percent: int, expose_plan: bool) -> None:
    """The rewrite, on ``graph`` itself: the initializers are not touched, so a model of several
    GB is not held twice, and weights kept in an external data file stay there, unread."""
    outer = ({tensor.name for tensor in graph.initializer} | {tensor.values.name for tensor in graph.sparse_initializer}
             | {tensor.name for tensor in graph.input})
    nodes = _plan_nodes(mask, min_saving_percent)
    for tensor in graph.output:
        nodes.append(oh.make_node("SequenceEmpty", [], [_P + "seq_" + tensor.name],
                                  dtype=tensor.type.tensor_type.elem_type))
    nodes.append(oh.make_node(
        "Loop", [_P + "trips", _P + "true"] + [_P + "seq_" + tensor.name for tensor in graph.output],
        [_P + "groups_" + tensor.name for tensor in graph.output], body=_body(graph, outer),
    ))
    # The inverse of the sort puts the rows back in the request's order.
    nodes.append(_node("TopK", ["order", "B1"], ["order_sorted", "inverse"], largest=0, sorted=1))
    for tensor in graph.output:
        nodes += [oh.make_node("ConcatFromSequence", [_P + "groups_" + tensor.name], [_P + "cat_" + tensor.name],
                               axis=0),
                  oh.make_node("Gather", [_P + "cat_" + tensor.name, _P + "inverse"], [tensor.name], axis=0)]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]  # shapes of values now inside the loop body (their names changed there)
    if not graph.doc_string:
        graph.ClearField("doc_string")  # as onnx.helper.make_graph leaves it: the bytes of earlier builds
    if expose_plan:
        graph.output.extend(oh.make_tensor_value_info(name, TensorProto.INT64, [] if name == "lg_trips" else [2])
                            for name in PLAN_OUTPUTS)


def _external_files(model: onnx.ModelProto) -> list[str]:
    """The external data files the graph's initializers point to (locations relative to the model
    file): a model over the 2 GiB protobuf limit keeps its weights in ``<file>.data``
    (``model_build.export.onnx_weights.save_onnx``)."""
    from onnx.external_data_helper import uses_external_data

    return sorted({entry.value for tensor in model.graph.initializer if uses_external_data(tensor)
                   for entry in tensor.external_data if entry.key == "location"})


def _save_rewritten(model: onnx.ModelProto, path: Path, external: Sequence[str], *, name: str) -> None:
    """Write the rewritten graph to ``path``. Weights inline: as the export saves them. Weights in
    external files: the graph alone, its references unchanged (the weights were never read, so
    ``onnx.save_model`` writes none of them); the files must lie next to ``path``."""
    from triton_mme_cdk.model_build.export.onnx_weights import save_onnx

    if not external:
        save_onnx(model, path)
        return
    missing = [name for name in external if not (path.parent / name).is_file()]
    if missing:
        raise ExportError(f"external data file {missing[0]!r} is missing next to {path.name}", model=name)
    onnx.save_model(model, str(path))


# --------------------------------------------------------------------------------------------
# The build step
# --------------------------------------------------------------------------------------------


def _parity(spec: ModelSpec, plain: list[list[np.ndarray]], grouped: list[list[np.ndarray]],
            names: Sequence[str]) -> tuple[float, tuple[str, str] | None]:
    """(max |diff|, (output, what failed) or None). FP32: element-wise; INT8: the row cosine gate (a scorer's
    logits: its tolerance), as INT8 activations are quantized with one scale per tensor, which
    depends on the rows beside them."""
    worst, failure = 0.0, None
    min_cosine = spec.gates()[0]
    for batch_plain, batch_grouped in zip(plain, grouped, strict=True):
        for name, expected, actual in zip(names, batch_plain, batch_grouped, strict=True):
            if expected.shape != actual.shape or not np.isfinite(actual).all():
                return float("inf"), (name, f"output {name!r}: shape {actual.shape} or values not finite")
            diff = float(np.abs(actual.astype(np.float64) - expected).max(initial=0.0))
            worst = max(worst, diff)
            if spec.effective_precision == "int8" and spec.task in PAIR_TASKS:
                atol, rtol = spec.tolerance.atol, spec.tolerance.rtol
                if not np.allclose(actual, expected, atol=atol, rtol=rtol) and failure is None:
                    failure = name, f"output {name!r}: max |diff| {diff:.2e} > tolerance atol {atol} + rtol {rtol}"
            elif spec.effective_precision == "int8":
                cosine = float(row_cosines(actual, expected).min())
                if cosine < min_cosine and failure is None:
                    failure = name, f"output {name!r}: min row cosine {cosine:.6f} < {min_cosine}"
            elif not np.allclose(actual, expected, atol=PARITY_ATOL, rtol=PARITY_RTOL) and failure is None:
                failure = name, f"output {name!r}: max |diff| {diff:.2e} > atol {PARITY_ATOL} + rtol {PARITY_RTOL}"
    return worst, failure


def _with_split_batch(samples: Sequence[Batch]) -> list[Batch]:
    """``samples`` and, when none of them splits in two, one that does: the sample with the most
    rows (then the widest), its first half of rows cut to a quarter of the width by their mask."""
    if any(len(plan_groups(sample[MASK_INPUT]).groups) == 2 for sample in samples if MASK_INPUT in sample):
        return list(samples)
    candidates = [s for s in samples if MASK_INPUT in s and s[MASK_INPUT].shape[0] >= 2 and s[MASK_INPUT].shape[1] >= 2]
    if not candidates:
        return list(samples)
    base = max(candidates, key=lambda s: s[MASK_INPUT].shape)
    rows, width = base[MASK_INPUT].shape
    mask = np.ones_like(base[MASK_INPUT])
    mask[: rows // 2, max(1, width // 4):] = 0
    return [*samples, {**base, MASK_INPUT: mask}]


def _link_or_copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def group_lengths(
    spec: ModelSpec,
    exported: ExportedModel,
    samples: Sequence[Batch],
    *,
    runner_for: Callable[[ExportedModel, str | None], Runner],
) -> tuple[ExportedModel, str | None]:
    """The build step: rewrite ``exported`` in place where ``spec.groups_by_length`` says so, after
    proving on ``samples`` that the grouped graph computes what the plain one does.
    ``runner_for(model, graph_optimization_level)`` runs a file as the serving backend would
    (``model_build.export.validate.exported_runner``).

    Returns the model and a line for the build record (``None``: not grouped). Where the grouping
    was only the default, a graph it does not fit stays plain and the line says why; where
    ``text.group_by_length: true`` was given, that is an error naming the field.
    """
    if not spec.groups_by_length:
        return exported, None
    explicit = spec.text_inputs.group_by_length is True
    # The graph; weights in an external data file (above 2 GiB) stay there, unread.
    model = onnx.load(str(exported.path), load_external_data=False)
    external = _external_files(model)
    reason = graph_allows_grouping(model, exported)
    if reason is not None:
        if explicit:
            raise ExportError(f"text.group_by_length: got true, but {reason}; set it false or leave it unset",
                              model=spec.name)
        return exported, f"off: {reason}"
    level = spec.onnxruntime.graph_optimization_level if spec.onnxruntime else None
    names = [tensor.name for tensor in exported.outputs]
    samples = _with_split_batch(samples)
    splits = sum(len(plan_groups(sample[MASK_INPUT]).groups) == 2 for sample in samples if MASK_INPUT in sample)
    plain_runner = runner_for(exported, level)
    plain = [plain_runner(sample) for sample in samples]
    del plain_runner
    _group_in_place(model.graph, mask=MASK_INPUT, min_saving_percent=MIN_SAVING_PERCENT, expose_plan=False)
    with tempfile.TemporaryDirectory(dir=exported.path.parent, prefix=".grouped-") as scratch:
        candidate = ExportedModel(name=exported.name, format="onnx", path=Path(scratch) / exported.path.name,
                                  inputs=exported.inputs, outputs=exported.outputs)
        for name in external:  # the candidate reads the same weight files: linked, not copied
            _link_or_copy(exported.path.parent / name, Path(scratch) / name)
        _save_rewritten(model, candidate.path, external, name=exported.name)
        try:
            grouped_runner = runner_for(candidate, level)
            grouped = [grouped_runner(sample) for sample in samples]
        except ExportError as error:
            if explicit:
                raise
            return exported, f"off: ONNX Runtime cannot run the grouped graph ({error})"
        del grouped_runner
    worst, failure = _parity(spec, plain, grouped, names)
    if failure is not None:
        if explicit:
            raise ValidationMismatchError(
                f"text.group_by_length: the grouped graph differs from the plain one on the build's "
                f"samples ({failure[1]}); set text.group_by_length false",
                model=spec.name, output=failure[0], max_abs_diff=worst)
        return exported, f"off: the grouped graph differed from the plain one ({failure[1]})"
    _save_rewritten(model, exported.path, external, name=exported.name)
    return exported, (f"on: up to 2 length groups when they save >= {MIN_SAVING_PERCENT}% of the positions; "
                      f"grouped vs plain graph on {len(samples)} batches ({splits} split in two): max |diff| {worst:.1e}")

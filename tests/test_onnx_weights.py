"""The export writes the weights tensor by tensor (issue 36): the same graph as torch's own export."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper


class _Tiny(torch.nn.Module):
    """A tiny BERT (folded transposed MatMul weights, shared and integer buffers)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        shape: dict[str, Any] = {"vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 2,
                                    "num_attention_heads": 2, "intermediate_size": 128, "attn_implementation": "eager"}
        config = BertConfig(**shape)
        self.bert = BertModel(config).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def _export(tmp_path: Path, aside: bool) -> onnx.ModelProto:
    from triton_mme_cdk.model_build.export.onnx_weights import export_weights_aside

    module = _Tiny()
    args = (torch.randint(0, 1000, (2, 8)), torch.ones(2, 8, dtype=torch.long))
    options = dict(opset_version=18, input_names=["ids", "mask"], output_names=["out"],
                   dynamic_axes={"ids": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}}, do_constant_folding=True)
    path = tmp_path / ("aside" if aside else "plain") / "model.onnx"
    path.parent.mkdir()
    with torch.no_grad():
        if aside:
            export_weights_aside(module, args, path, **options)
        else:
            torch.onnx.export(module, args, str(path), dynamo=False, **options)  # type: ignore[arg-type]
    return onnx.load(str(path))


def test_weights_aside_is_the_exporters_graph_with_the_same_weights(tmp_path: Path) -> None:
    plain, aside = _export(tmp_path, aside=False), _export(tmp_path, aside=True)
    assert (tmp_path / "aside" / "model.onnx.data").stat().st_size > 256_000  # the embeddings went aside
    assert not (tmp_path / "plain" / "model.onnx.data").exists()
    assert [n.SerializeToString() for n in aside.graph.node] == [n.SerializeToString() for n in plain.graph.node]
    assert aside.graph.input == plain.graph.input and aside.graph.output == plain.graph.output
    assert aside.opset_import == plain.opset_import and aside.ir_version == plain.ir_version
    assert [t.name for t in aside.graph.initializer] == [t.name for t in plain.graph.initializer]
    for mine, theirs in zip(aside.graph.initializer, plain.graph.initializer, strict=True):
        assert (mine.data_type, list(mine.dims)) == (theirs.data_type, list(theirs.dims)), mine.name
        np.testing.assert_array_equal(numpy_helper.to_array(mine), numpy_helper.to_array(theirs))
    onnx.checker.check_model(str(tmp_path / "aside" / "model.onnx"))


def test_save_onnx_puts_weights_aside_from_the_threshold_and_removes_a_stale_side_file(tmp_path: Path) -> None:
    from triton_mme_cdk.model_build.export.onnx_weights import save_onnx

    weights = numpy_helper.from_array(np.arange(4096, dtype=np.float32).reshape(64, 64), "w")
    graph = onnx.helper.make_graph([onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])], [weights])
    model = onnx.helper.make_model(graph)
    path = tmp_path / "model.onnx"
    side = tmp_path / "model.onnx.data"
    aside = onnx.ModelProto()
    aside.CopyFrom(model)
    save_onnx(aside, path, external_from=1000)
    first = (path.read_bytes(), side.read_bytes())
    assert side.stat().st_size == 4096 * 4
    save_onnx(model, path, external_from=10**6)  # below: one file, the side file gone
    assert not side.exists()
    np.testing.assert_array_equal(numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0]),
                                  numpy_helper.to_array(weights))
    again = onnx.ModelProto()
    again.CopyFrom(onnx.helper.make_model(graph))
    save_onnx(again, path, external_from=1000)
    assert (path.read_bytes(), side.read_bytes()) == first  # deterministic, not appended to


def test_the_single_file_save_writes_what_serializing_the_whole_model_writes(tmp_path: Path) -> None:
    """``write_model`` streams the model one initializer at a time: the bytes must be exactly
    ``SerializeToString()``'s, for a real export and for a model using every later field."""
    import io

    from triton_mme_cdk.model_build.export.onnx_weights import save_onnx, write_model

    exported = _export(tmp_path, aside=False)
    exported.doc_string, exported.producer_name, exported.model_version = "doc", "test", 3
    onnx.helper.set_model_props(exported, {"key": "value"})  # metadata_props: a field after graph
    exported.graph.doc_string = "after the initializers"
    exported.graph.value_info.append(onnx.helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [1]))
    exported.functions.append(onnx.helper.make_function("local", "f", ["a"], ["b"],
                                                        [onnx.helper.make_node("Identity", ["a"], ["b"])],
                                                        [onnx.helper.make_opsetid("", 18)]))
    no_graph = onnx.ModelProto(ir_version=9, producer_name="empty")
    for model in (exported, no_graph):
        out = io.BytesIO()
        write_model(model, out)
        assert out.getvalue() == model.SerializeToString()
    path = tmp_path / "saved.onnx"
    save_onnx(exported, path, external_from=10**9)
    assert path.read_bytes() == exported.SerializeToString() and len(exported.graph.initializer) > 10

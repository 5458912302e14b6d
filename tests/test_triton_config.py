"""config.pbtxt rendering and the load-time checks Triton makes (no server needed)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2 as mc

from triton_mme_cdk.model_build.artifact.render import render_config
from triton_mme_cdk.model_build.artifact.triton_config import check_config
from triton_mme_cdk.model_build.errors import TritonConfigError
from triton_mme_cdk.model_build.manifest import ModelSpec
from triton_mme_cdk.model_build.types import ExportedModel, TensorSpec

ONNX_SIGNATURE = ExportedModel(
    name="tiny",
    format="onnx",
    path=Path("model.onnx"),
    inputs=(
        TensorSpec("input_ids", "int64", (-1, -1)),
        TensorSpec("attention_mask", "int64", (-1, -1)),
    ),
    outputs=(TensorSpec("embedding", "float32", (-1, 8)),),
)
TORCHSCRIPT_SIGNATURE = ExportedModel(
    name="tiny-ts",
    format="torchscript",
    path=Path("model.pt"),
    inputs=(TensorSpec("x__0", "float32", (-1, 4)), TensorSpec("mask__1", "int64", (-1, 4))),
    outputs=(TensorSpec("y__0", "float32", (-1, 3)), TensorSpec("score__1", "float32", (-1,))),
)


def onnx_spec(**overrides: Any) -> ModelSpec:
    data: dict[str, Any] = {
        "name": "tiny",
        "source": {"kind": "onnx", "path": "tiny.onnx"},
        "task": "feature-extraction",
        "format": "onnx",
        "max_batch_size": 8,
    }
    data.update(overrides)
    return ModelSpec.model_validate(data)


def torchscript_spec(**overrides: Any) -> ModelSpec:
    data: dict[str, Any] = {
        "name": "tiny-ts",
        "source": {"kind": "local", "path": "tiny"},
        "task": "feature-extraction",
        "format": "torchscript",
        "max_batch_size": 4,
    }
    data.update(overrides)
    return ModelSpec.model_validate(data)


FULL_TUNING = {
    "dynamic_batching": {
        "preferred_batch_size": [2, 4],
        "max_queue_delay_microseconds": 500,
        "preserve_ordering": True,
    },
    "instance_group": {"kind": "KIND_GPU", "count": 2},
    "onnxruntime": {
        "graph_optimization_level": "extended",
        "cudnn_conv_algo_search": "heuristic",
        "arena_extend_strategy": "same_as_requested",
        "gpu_mem_limit": 4294967296,
        "enable_mem_arena": True,
        "enable_mem_pattern": False,
        "do_copy_in_default_stream": True,
        "execution_mode": "parallel",
        "intra_op_thread_count": 2,
        "inter_op_thread_count": 2,
    },
    "tensorrt": {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": 1073741824,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": "/tmp/trt",
        "extra": {"trt_builder_optimization_level": "3"},
    },
}


def parse(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def test_onnx_render_has_every_setting_as_triton_expects() -> None:
    text = render_config(onnx_spec(**FULL_TUNING), ONNX_SIGNATURE)
    config = parse(text)

    assert (config.name, config.backend, config.platform) == ("tiny", "onnxruntime", "onnxruntime_onnx")
    assert config.max_batch_size == 8
    # Dims leave the batch dimension out when max_batch_size >= 1.
    assert [(i.name, mc.DataType.Name(i.data_type), list(i.dims)) for i in config.input] == [
        ("input_ids", "TYPE_INT64", [-1]),
        ("attention_mask", "TYPE_INT64", [-1]),
    ]
    assert [(o.name, mc.DataType.Name(o.data_type), list(o.dims)) for o in config.output] == [
        ("embedding", "TYPE_FP32", [8])
    ]
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.dynamic_batching.preserve_ordering is True
    assert [(mc.ModelInstanceGroup.Kind.Name(g.kind), g.count) for g in config.instance_group] == [
        ("KIND_GPU", 2)
    ]
    # Named manifest values become the backend's numeric strings.
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "execution_mode": "1",
        "cudnn_conv_algo_search": "1",
        "arena_extend_strategy": "1",
        "gpu_mem_limit": "4294967296",
        "enable_mem_arena": "1",
        "enable_mem_pattern": "0",
        "do_copy_in_default_stream": "1",
        "intra_op_thread_count": "2",
        "inter_op_thread_count": "2",
    }
    assert config.optimization.graph.level == 1
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [a.name for a in accelerators] == ["tensorrt"]
    assert dict(accelerators[0].parameters) == {
        "precision_mode": "FP16",
        "max_workspace_size_bytes": "1073741824",
        "trt_engine_cache_enable": "true",
        "trt_engine_cache_path": "/tmp/trt",
        "trt_builder_optimization_level": "3",
    }
    # The text itself is what Triton reads: string values are quoted strings.
    assert 'key: "execution_mode"\n  value {\n    string_value: "1"' in text
    assert isinstance(check_config(text), mc.ModelConfig)


def test_render_is_deterministic() -> None:
    first = render_config(onnx_spec(**FULL_TUNING), ONNX_SIGNATURE)
    # A new spec with the same content, keys given in another order.
    reordered = dict(reversed(list(FULL_TUNING.items())))
    second = render_config(onnx_spec(**reordered), ONNX_SIGNATURE)
    assert first == second
    keys = re.findall(r'key: "([^"]+)"\n  value \{', first)
    assert keys == sorted(keys) and len(keys) == 9


def test_torchscript_render_uses_pytorch_backend_and_indexed_names() -> None:
    text = render_config(torchscript_spec(), TORCHSCRIPT_SIGNATURE, default_model_filename="model.pt")
    config = parse(text)
    assert (config.backend, config.platform) == ("pytorch", "pytorch_libtorch")
    assert config.default_model_filename == "model.pt"
    assert [i.name for i in config.input] == ["x__0", "mask__1"]
    assert [mc.DataType.Name(i.data_type) for i in config.input] == ["TYPE_FP32", "TYPE_INT64"]
    assert [list(i.dims) for i in config.input] == [[4], [4]]
    # A per-batch scalar output ([batch]) needs dims [1] plus an empty reshape.
    score = config.output[1]
    assert (score.name, list(score.dims), score.HasField("reshape"), list(score.reshape.shape)) == (
        "score__1",
        [1],
        True,
        [],
    )
    assert not config.output[0].HasField("reshape")
    assert len(config.parameters) == 0
    assert not config.HasField("optimization")


@pytest.mark.parametrize(
    ("level", "expected"), [("basic", -1), ("extended", 1), ("disable_all", 2), ("all", None)]
)
def test_graph_levels_map_to_backend_values(level: str, expected: int | None) -> None:
    config = parse(render_config(onnx_spec(onnxruntime={"graph_optimization_level": level}), ONNX_SIGNATURE))
    if expected is None:
        # Absent means "all optimizations" in the backend.
        assert not config.optimization.HasField("graph")
    else:
        assert config.optimization.graph.level == expected


def test_max_batch_size_zero_keeps_full_shape() -> None:
    signature = ExportedModel(
        name="tiny",
        format="onnx",
        path=Path("m.onnx"),
        inputs=(TensorSpec("x", "float32", (1, 3, 8, 8)),),
        outputs=(TensorSpec("y", "float16", (1, 10)),),
    )
    config = parse(render_config(onnx_spec(max_batch_size=0), signature))
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 3, 8, 8]
    assert (list(config.output[0].dims), mc.DataType.Name(config.output[0].data_type)) == ([1, 10], "TYPE_FP16")


def test_fixed_batch_dimension_with_batching_is_refused() -> None:
    signature = ExportedModel(
        name="tiny",
        format="onnx",
        path=Path("m.onnx"),
        inputs=(TensorSpec("pixel_values", "float32", (1, 3, 8, 8)),),
        outputs=(TensorSpec("logits", "float32", (-1, 10)),),
    )
    with pytest.raises(TritonConfigError) as caught:
        render_config(onnx_spec(max_batch_size=4), signature)
    message = str(caught.value)
    assert "'pixel_values'" in message
    assert "fixed at 1" in message
    assert "max_batch_size 4" in message
    assert caught.value.model == "tiny"


def test_format_mismatch_is_refused() -> None:
    with pytest.raises(TritonConfigError, match="format"):
        render_config(onnx_spec(), TORCHSCRIPT_SIGNATURE)


# --------------------------------------------------------------------------------------------
# Checking: a corpus of configs Triton would refuse
# --------------------------------------------------------------------------------------------

GOOD = """
name: "tiny"
backend: "onnxruntime"
platform: "onnxruntime_onnx"
max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 3 ] }
instance_group { kind: KIND_GPU count: 1 }
dynamic_batching { preferred_batch_size: [ 2, 4 ] }
parameters { key: "execution_mode" value { string_value: "0" } }
optimization {
  graph { level: -1 }
  execution_accelerators {
    gpu_execution_accelerator { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } }
  }
}
"""

#: (description, replace this, with that, substrings the message must hold: field and value)
BAD_CONFIGS = [
    ("preferred size above max batch", "preferred_batch_size: [ 2, 4 ]", "preferred_batch_size: [ 2, 16 ]",
     ["dynamic_batching.preferred_batch_size", "got 16", "at most max_batch_size (8)"]),
    ("preferred size zero", "preferred_batch_size: [ 2, 4 ]", "preferred_batch_size: [ 0 ]",
     ["dynamic_batching.preferred_batch_size", "got 0", ">= 1"]),
    ("dynamic batching without batching", "max_batch_size: 8\ninput { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }",
     "max_batch_size: 0\ninput { name: \"x\" data_type: TYPE_FP32 dims: [ 4 ] }",
     ["dynamic_batching", "max_batch_size 0", "max_batch_size >= 1"]),
    ("negative max batch", "max_batch_size: 8", "max_batch_size: -1",
     ["max_batch_size", "got -1", ">= 0"]),
    ("unknown ort parameter key", 'key: "execution_mode" value { string_value: "0" }',
     'key: "exec_mode" value { string_value: "0" }', ["parameters key", "'exec_mode'", "execution_mode"]),
    ("bad execution_mode", 'string_value: "0"', 'string_value: "2"',
     ["parameters['execution_mode']", "'2'", "'0', '1'"]),
    ("bad cudnn_conv_algo_search", 'key: "execution_mode" value { string_value: "0" }',
     'key: "cudnn_conv_algo_search" value { string_value: "3" }',
     ["parameters['cudnn_conv_algo_search']", "'3'", "'0', '1', '2'"]),
    ("bad arena_extend_strategy", 'key: "execution_mode" value { string_value: "0" }',
     'key: "arena_extend_strategy" value { string_value: "2" }',
     ["parameters['arena_extend_strategy']", "'2'", "'0', '1'"]),
    ("bad boolean", 'key: "execution_mode" value { string_value: "0" }',
     'key: "enable_mem_arena" value { string_value: "yes" }',
     ["parameters['enable_mem_arena']", "'yes'", "'true'"]),
    ("bad gpu_mem_limit", 'key: "execution_mode" value { string_value: "0" }',
     'key: "gpu_mem_limit" value { string_value: "-5" }',
     ["parameters['gpu_mem_limit']", "'-5'", ">= 1"]),
    ("bad thread count", 'key: "execution_mode" value { string_value: "0" }',
     'key: "intra_op_thread_count" value { string_value: "two" }',
     ["parameters['intra_op_thread_count']", "'two'", "integer >= 0"]),
    # trt_fp16_enable is an ONNX Runtime option, not one of the backend's keys: a load error.
    ("unknown tensorrt key", 'key: "precision_mode" value: "FP16"', 'key: "trt_fp16_enable" value: "1"',
     ["tensorrt).parameters key", "'trt_fp16_enable'", "precision_mode"]),
    ("bad precision_mode", 'value: "FP16"', 'value: "FP8"',
     ["parameters['precision_mode']", "'FP8'", "'FP32', 'FP16', 'BF16', 'INT8'"]),
    ("bad tensorrt boolean", 'key: "precision_mode" value: "FP16"', 'key: "trt_engine_cache_enable" value: "maybe"',
     ["parameters['trt_engine_cache_enable']", "'maybe'"]),
    ("unknown accelerator", 'name: "tensorrt"', 'name: "openvino"',
     ["gpu_execution_accelerator[0].name", "'openvino'", "tensorrt, cuda"]),
    ("bad graph level", "level: -1", "level: 3",
     ["optimization.graph.level", "got 3", "-1 (basic), 1 (extended), 2 (disable all)"]),
    ("duplicate tensor names", 'output { name: "y" data_type: TYPE_FP32 dims: [ 3 ] }',
     'output { name: "y" data_type: TYPE_FP32 dims: [ 3 ] }\noutput { name: "y" data_type: TYPE_FP32 dims: [ 1 ] }',
     ["output[1](y).name", "'y'", "unique", "output[0]"]),
    ("zero dim", "dims: [ 4 ]", "dims: [ 0, 4 ]", ["input[0](x).dims", "[0, 4]", "-1 (variable) or >= 1"]),
    ("empty dims", "dims: [ 3 ]", "", ["output[0](y).dims", "got '[]'", "may not be empty"]),
    ("no data type", "data_type: TYPE_FP32 dims: [ 4 ]", "dims: [ 4 ]",
     ["input[0](x).data_type", "TYPE_INVALID"]),
    ("negative instance count", "count: 1", "count: -2", ["instance_group[0].count", "got -2", ">= 1"]),
    ("platform does not match backend", 'platform: "onnxruntime_onnx"', 'platform: "pytorch_libtorch"',
     ["platform", "'pytorch_libtorch'", "does not match backend 'onnxruntime'"]),
    ("unknown backend", 'backend: "onnxruntime"\nplatform: "onnxruntime_onnx"', 'backend: "tensorflow"',
     ["backend", "'tensorflow'", "allowed"]),
]


def _words_outside_values(message: str) -> str:
    """The message without quoted values and enum-style identifiers (TYPE_FP32, KIND_GPU)."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\b[A-Z][A-Z0-9_]*[A-Z0-9]\b", "", message)


def test_good_config_passes() -> None:
    config = check_config(GOOD, model="tiny")
    assert config.max_batch_size == 8
    assert config.optimization.graph.level == -1


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [case[1:] for case in BAD_CONFIGS],
    ids=[case[0] for case in BAD_CONFIGS],
)
def test_bad_config_names_field_and_value(old: str, new: str, expected: list[str]) -> None:
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    with pytest.raises(TritonConfigError) as caught:
        check_config(text, model="bert-3")
    message = str(caught.value)
    assert message.startswith("model 'bert-3': ")
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"
    outside = _words_outside_values(message)
    assert outside == outside.lower(), message
    assert caught.value.model == "bert-3"


def test_every_problem_is_reported_at_once() -> None:
    text = GOOD.replace("level: -1", "level: 7").replace('value: "FP16"', 'value: "FP8"')
    with pytest.raises(TritonConfigError) as caught:
        check_config(text, model="tiny")
    lines = str(caught.value).splitlines()
    assert any("optimization.graph.level" in line for line in lines)
    assert any("precision_mode" in line for line in lines)


def test_parse_error_names_the_line() -> None:
    text = 'name: "tiny"\nbackend: "onnxruntime"\nmax_batch_sise: 8\n'
    with pytest.raises(TritonConfigError) as caught:
        check_config(text, model="tiny")
    message = str(caught.value)
    assert "line 3" in message
    assert "max_batch_sise" in message


def test_unknown_enum_is_a_parse_error() -> None:
    text = GOOD.replace("KIND_GPU", "KIND_TPU")
    with pytest.raises(TritonConfigError, match=r"line \d+.*KIND_TPU"):
        check_config(text, model="tiny")


def test_empty_reshape_needs_batching() -> None:
    text = (
        'name: "t"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input { name: "x__0" data_type: TYPE_FP32 dims: [ 4 ] }\n'
        'output { name: "y__0" data_type: TYPE_FP32 dims: [ 1 ] reshape { } }\n'
    )
    with pytest.raises(TritonConfigError) as caught:
        check_config(text, model="t")
    assert "output[0](y__0).reshape.shape" in str(caught.value)
    # The same tensor with batching on is what Triton's own auto-complete writes.
    check_config(text.replace("max_batch_size: 0", "max_batch_size: 2"), model="t")


def test_accepted_spellings_match_the_backend_parsers() -> None:
    # ParseBoolValue takes true/false/on/off/1/0 in any case; thread counts of 0 mean "default".
    text = GOOD.replace(
        'parameters { key: "execution_mode" value { string_value: "0" } }',
        'parameters { key: "enable_mem_pattern" value { string_value: "TRUE" } }\n'
        'parameters { key: "enable_mem_arena" value { string_value: "off" } }\n'
        'parameters { key: "intra_op_thread_count" value { string_value: "0" } }\n'
        'parameters { key: "memory.enable_memory_arena_shrinkage" value { string_value: "cpu:0;gpu:0" } }\n',
    )
    config = check_config(text, model="tiny")
    assert config.parameters["enable_mem_arena"].string_value == "off"


def test_repository_config_checks_ensembles_and_python_members_with_core_rules() -> None:
    """The gate's per-folder check: check_config refuses an ensemble or python backend (not an export's
    backend); check_repository_config applies the core rules to them and check_config to the rest."""
    from triton_mme_cdk.model_build.artifact.triton_config import check_repository_config
    from triton_mme_cdk.model_build.errors import TritonConfigError

    python = ('name: "tokenizer" backend: "python" max_batch_size: 8\n'
              'input { name: "TEXT" data_type: TYPE_STRING dims: [1] }\n'
              'output { name: "input_ids" data_type: TYPE_INT64 dims: [128] }\n')
    ensemble = 'name: "ensemble" platform: "ensemble" max_batch_size: 8\n' + python.split("\n", 1)[1]
    for text in (python, ensemble):
        with pytest.raises(TritonConfigError):
            check_config(text, model="t")
        assert check_repository_config(text, model="t").max_batch_size == 8
        with pytest.raises(TritonConfigError, match=r"output\[0\]\(input_ids\)\.dims: got \[0\]; each dimension"):
            check_repository_config(text.replace("dims: [128]", "dims: [0]"), model="t")
    with pytest.raises(TritonConfigError, match="max_batch_size: got -1"):
        check_repository_config(GOOD.replace("max_batch_size: 8", "max_batch_size: -1"), model="t")


def test_engine_cache_keeps_engines_per_graph_on_the_instance(tmp_path: Path) -> None:
    """``tensorrt.engine_cache``: the provider's engines and timing cache in a folder named after the
    graph's bytes, so a model reloaded on the instance reuses its engine and an updated one never does."""
    graph = tmp_path / "model.onnx"
    configs = []
    for content in (b"graph one", b"graph two"):
        graph.write_bytes(content)
        signature = ExportedModel(name="tiny", format="onnx", path=graph, inputs=ONNX_SIGNATURE.inputs,
                                  outputs=ONNX_SIGNATURE.outputs)
        text = render_config(onnx_spec(tensorrt={"precision_mode": "FP16", "engine_cache": True}), signature)
        (accelerator,) = parse(text).optimization.execution_accelerators.gpu_execution_accelerator
        configs.append(dict(accelerator.parameters))
    for params, content in zip(configs, (b"graph one", b"graph two"), strict=True):
        folder = f"/tmp/triton-mme-trt-cache/tiny-{hashlib.sha256(content).hexdigest()[:12]}"
        assert params == {"precision_mode": "FP16", "trt_engine_cache_enable": "true", "trt_engine_cache_path": folder,
                          "trt_timing_cache_enable": "true", "trt_timing_cache_path": folder}
    with pytest.raises(ValidationError) as caught:
        onnx_spec(tensorrt={"engine_cache": True, "trt_engine_cache_enable": True})
    assert "engine_cache: true with trt_engine_cache_enable given; engine_cache sets the cache keys itself" in (
        str(caught.value))

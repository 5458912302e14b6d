"""Benchmarks of the Triton MME project: ``python -m benchmarks`` (``make bench``).

Four benchmarks, one module each, one JSON result and one PNG chart each under
``benchmarks/results/``, and ``docs/benchmarks.md`` rendered from those JSON files:

- :mod:`benchmarks.synth_scale`: ``cdk synth`` of manifests of 1, 100 and 1000 models;
- :mod:`benchmarks.publish`: 200 copies of a tarball, the project's publish against a loop of uploads;
- :mod:`benchmarks.inference`: the built MiniLM artifact on ONNX Runtime against PyTorch eager;
- :mod:`benchmarks.artifact`: FP32 against FP16 tarballs and gzip levels 1, 6 and 9.

They are measurements, not tests: the test suite only runs them at a tiny size (``--tiny``) and
checks the files they write.
"""

from benchmarks._common import BENCHMARK_NAMES, SCHEMA_VERSION, validate_result

__all__ = ["BENCHMARK_NAMES", "SCHEMA_VERSION", "validate_result"]

"""Export: a manifest entry's source -> the model file Triton loads, proven against PyTorch.

The step's modules, in the order the build runs them:

- ``sources``: the source as files on disk (a local folder, an installed package, the hub at a
  pinned commit, an S3 prefix, a ready ``.onnx``);
- ``eager``: the eager PyTorch module (``pooling``: sentence-embedding pooling inside the graph)
  and the inputs it is traced, validated and calibrated on;
- ``convert``: the traced ``model.onnx`` (``fusion``: transformer fusions, runtime limits) or
  ``model.pt``, its signature read back from the file;
- ``optimize``: INT8 where asked, against the FP32 reference;
- ``length_groups``: text models on KIND_CPU: the encoder run once per length group inside the
  served graph, proven equal to the plain graph before it is kept;
- ``validate``: every output compared with PyTorch eager (and sentence-transformers), the
  accuracy gates, the reference ``.npz``; ``export_and_validate`` is the step's one entry point.

Owns: everything between a source and a checked model file. No Triton config, no tarball.
Importing this package imports nothing heavy: torch and onnx come with the modules that need them,
so callers import from the modules (``model_build.export.validate``...).

May import: ``shared``, ``manifest``.
"""

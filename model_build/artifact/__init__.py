"""The served artifact: an exported model file -> the Triton model folder and the ``model.tar.gz``
the SageMaker Triton container loads.

- ``render``: the model's ``config.pbtxt`` from its manifest entry and the exported signature;
- ``triton_config``: the checks Triton's core and the ONNX Runtime backend make when they load a
  config (parse, check, the backend and default file of a config);
- ``pack``: the reproducible tarball (same inputs, same bytes), ONNX external-data files included;
- ``gate``: the pre-publish gate on a written tarball, with ``signature`` (the config against the
  graph) and ``backend`` (opening a model as its Triton backend would);
- ``tarball``: the one safe reader of tarballs (hostile archives refused before a byte is
  written), for the gate, the smoke test and the local endpoint.

Owns: the Triton model repository and its tarball. No S3, no torch export.
Importing this package imports nothing heavy; callers import from the modules.

May import: ``shared``, ``manifest``.
"""

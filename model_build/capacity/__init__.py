"""Capacity: will the models fit the fleet, and how many instances keep them warm.

- ``footprint``: each model's footprint (weights, estimated GPU memory when loaded, host memory,
  disk, load time), recorded by the build in the release index; every coefficient names its source
  and every estimate is labelled as one;
- ``fit``: the checks at synth, ``validate --instance-type`` and build: a model larger than the
  fleet's usable GPU memory is refused, a served set larger than the instance's disk warns;
- ``simulate``: the fleet as caches (GPU memory and disk per instance, LRU eviction) under a
  traffic profile, for ``python -m model_build capacity`` and the capacity line of ``plan``.

Standard library only where synth imports it (``footprint``, ``fit``): the CDK app checks fit
without torch, onnx or transformers.

Owns: what a model needs of a fleet instance and what a fleet of instances does under traffic. It
never builds, publishes or serves: footprints come from what the build measured (the release
index) or from the manifest's sources sized without loading them, and the instance shapes from
``model_build.gpu_hosts``.

May import: ``shared``, ``manifest``, ``release``.
"""

"""Python-based Triton backends named ``onnxruntime`` and ``pytorch`` for the local endpoint.

The ``tritonserver`` of the PyPI package ``nvidia-pytriton`` has the python backend but neither
C++ backend. Triton resolves a model's ``backend: "onnxruntime"`` to
``<backends>/onnxruntime/model.py`` when ``libtriton_onnxruntime.so`` is absent, so a published
tarball loads unchanged on these files. They run inside the python backend's stub, on the
system Python 3.11 with the triton environment's packages (``model_build.tools.local_endpoint.triton_server``),
never in the project venv: each file is self-contained and imports only numpy, onnxruntime / torch
and Triton's utils.
"""

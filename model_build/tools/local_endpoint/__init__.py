"""``endpoint``: a SageMaker multi-model endpoint on this machine, on the real ``tritonserver``.

``server`` answers SageMaker's runtime and control-plane APIs on loopback; ``model_cache`` plays
SageMaker's part of a multi-model endpoint (a target looked up on first use, downloaded, checked,
unpacked, loaded; least-recently-used models unloaded when memory runs short); ``served_release``
is what it serves; ``triton_server`` starts the real server (``triton_netns``: in a network
namespace of its own where the host allows one) with the Python-based backends of
``triton_backends``.
"""

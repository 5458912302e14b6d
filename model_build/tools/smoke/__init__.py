"""``smoke``: a deployed multi-model endpoint asked, target by target, whether it answers as built.

``prepare`` finds the release the endpoint serves and the references recorded at build time;
``runner`` invokes each target and compares its answer; ``cli`` is the command and its table;
``codec`` is the client side of Triton's binary+JSON protocol the requests use.
"""

"""Stage 5, the build pipeline: an annotated module -> XLA's compile -> an ``Executable``, once.

``compile.py`` (XLA's options, jax's compilation machinery), ``executable.py`` (the
one runnable type; lower -> compile -> pin and retry), ``cache.py`` (compile once
per program: ``get_executable``) and ``agreement.py`` (processes of one job compile
the same program). Dispatch runs what this stage builds.
"""

"""The what-if: what would each allocator reserve for your training run, and what fits?

An application built on the library (:mod:`vrampool`): it captures allocation traces of training
steps on the CPU, under fake tensors (no GPU, no memory behind them), reads traces recorded
elsewhere (PyTorch memory snapshots, vrampool's event log), replays them through vrampool's
strategies, models of other allocators and the static plan on a simulated device, and finds the
largest batch, or the fewest ranks, whose steps fit in a device's memory. The ``vrampool``
command (:mod:`vrampool.whatif.cli`) is its front end.

- :mod:`~vrampool.whatif.traces`: the trace model and the readers of trace files (JSON lines,
  CSV, PyTorch snapshots, event logs).
- :mod:`~vrampool.whatif.capture`: the storage tracker that records a trace of PyTorch code.
- :mod:`~vrampool.whatif.training`: model functions' training steps captured under fake tensors.
- :mod:`~vrampool.whatif.workloads` and :mod:`~vrampool.whatif.models`: the built-in models.
- :mod:`~vrampool.whatif.replay`: the replay of a trace through each allocator.
- :mod:`~vrampool.whatif.fit` and :mod:`~vrampool.whatif.cluster`: what fits on one device and
  on every rank of a cluster (and one trace per rank).
- :mod:`~vrampool.whatif.ahead`: plans made ahead (:mod:`vrampool.ahead`) from a captured trace or
  from a training step run under fake tensors.
- :mod:`~vrampool.whatif.liveness`: tensor lifetimes from PyTorch graphs or traces.
- :mod:`~vrampool.whatif.plot`: the SVG plots.

The library never imports this package. Modules here import the library's by their own paths (``from vrampool.pool import
DevicePool``), never through ``vrampool``'s ``__init__``.
"""

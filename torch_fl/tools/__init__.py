"""The tools: they observe torch_fl from above and return plain report objects, never change what runs.

profiler.py      fl.profile, fl.compare_backends, fl.measure_compiled: per-op time, paths, kernel counts
alignment.py     fl.align: forward, gradients, AMP vs float32, a loss curve; the first divergent layer
numerics.py      errors against float64 with the branch matched (the project's one numerical rule)
optrace.py       op-by-op traces of two runs and their first difference (for alignment)
coverage.py      fl.coverage (`torch-fl coverage`: PyTorch's OpInfo tests on a backend), model_coverage,
                 fl.path_table (the path each op would take per dtype, the capability explorer's grid)
zoo.py           real models on every backend against float64 (`torch-fl zoo`), and the hand-written
                 reference models (ResNet-50, a Transformer encoder, LSTM, GRU)
doctor.py        `torch-fl doctor`: every backend end to end
stepwatch.py     fl.watch: per-step time, memory and loss of a training loop
checker/         `torch-fl plugin check`: a plugin's conformance to the ABI contract and PyTorch CPU

They stand on everything below them (runtime, dispatch, the compiler, the feature packages); nothing below
imports them (pyproject.toml's import contracts). Import the module you need: this package imports none."""

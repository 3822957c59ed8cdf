"""dtrain's trainer: the Lightning DDP runner each worker pod starts under torchrun (`python -m dtrain_trainer`).

Modules: `config` (the config file and torchrun's environment, checked), `loading`
(classPath + initArgs), `flavor` (which Lightning package, lightning.pytorch or
pytorch_lightning, a job trains with), `models` and `data` (the built-ins), `checkpointing`,
`progress` (live progress sinks; the JSONL record format is documented there),
`export` (ONNX export and its ONNX Runtime check), `runner` (the entry point);
the engine builder is its own package, `dtrain_engine`.
"""

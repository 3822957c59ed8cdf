"""dtrain's trainer: the Lightning DDP runner each worker pod starts under torchrun (`python -m dtrain_trainer`).

Modules: `config` (the config file and torchrun's environment, checked), `loading`
(classPath + initArgs), `models` and `data` (the built-ins), `checkpointing`,
`progress` (live progress sinks; the JSONL record format is documented there),
`export` (ONNX export and its ONNX Runtime check), `runner` (the entry point);
`engine` builds the TensorRT engine (`dtrain build-engine`).
"""

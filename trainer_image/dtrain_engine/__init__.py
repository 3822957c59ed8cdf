"""dtrain's engine builder (`dtrain build-engine`): a TensorRT engine from the exported ONNX model, checked against ONNX Runtime and the PyTorch model."""
